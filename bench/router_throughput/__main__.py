"""`python -m bench.router_throughput`: the command line (see the package docstring, which is
also its --help)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import sys
import tempfile
from datetime import UTC, datetime

from bench import router_throughput
from bench.common import exit_cleanly_on_sigterm
from bench.router_throughput.run import bench
from bench.router_throughput.workload import CLUSTER, MODELS, table
from services.router.settings import RouterSettings


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.router_throughput",
                                     description=router_throughput.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=500, help="tasks per run (per C)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--limit", type=int, default=8, help="max_concurrency per model")
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--namespace", default="bench-router")
    parser.add_argument("--profile", default="", help="write cProfile stats of the cases here")
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="cw-bench-router-")
    settings = RouterSettings(
        kafka_bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"),
        namespace=args.namespace, cluster_id=CLUSTER, state_dir=state)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# router throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores, load average {load} before the run), "
          f"{args.nodes} nodes x {len(MODELS)} models (max_concurrency {args.limit}), "
          f"{args.tasks} tasks per run, warm-up {args.warmup}")
    profile = cProfile.Profile() if args.profile else None
    rows = await bench(settings, nodes=args.nodes, limit=args.limit, tasks=args.tasks,
                       concurrency=args.concurrency, warmup=args.warmup, profile=profile,
                       report=lambda row: print(json.dumps(row), flush=True))
    print()
    print(table(rows))
    if profile is not None:
        profile.dump_stats(args.profile)
        stats = pstats.Stats(profile, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
