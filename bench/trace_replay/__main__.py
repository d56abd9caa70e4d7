"""`python -m bench.trace_replay`: the command line of the trace replays (see the package
docstring, which is also its --help)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import bench.trace_replay
from bench.trace_replay.philly import philly_table, replay_philly
from bench.trace_replay.titan import replay_titan, titan_table
from bench.trace_replay.traces import DEFAULT_TRACES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.trace_replay",
                                     description=bench.trace_replay.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", default=["philly", "titan"],
                        choices=["philly", "titan"])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES,
                        help="The traces folder (default: bench/traces).")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jitter-pct", type=float, default=5.0,
                        help="Each node's fixed load offset is drawn from +-this.")
    parser.add_argument("--suspect-after", type=float, default=8.0,
                        help="COLLECTOR_SUSPECT_AFTER_INTERVALS for the replays.")
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    parser.add_argument("--drain", type=float, default=3.0,
                        help="Seconds to keep reading after the window ends.")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="titan: at most this much longer while failures lack a need.")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the namespaces' topics and Redis keys.")
    parser.add_argument("--series", action="store_true",
                        help="Also print the Philly per-minute series as JSON lines.")
    parser.add_argument("--table-every", type=int, default=20,
                        help="Trace minutes per row of the Philly table.")
    philly = parser.add_argument_group("philly")
    philly.add_argument("--start", default="2017-11-09 17:00", help="First trace minute.")
    philly.add_argument("--minutes", type=int, default=240, help="Trace minutes replayed.")
    philly.add_argument("--seconds-per-minute", type=float, default=0.5,
                        help="Real seconds per trace minute.")
    philly.add_argument("--nodes", type=int, default=100, help="Simulated fleet size.")
    philly.add_argument("--busy-pct", type=float, default=90.0)
    philly.add_argument("--idle-pct", type=float, default=5.0)
    philly.add_argument("--jobs", choices=["whole-node", "movable", "none"],
                        default="whole-node",
                        help="What busy nodes report running: one whole-node gang job as "
                             "Philly's are (default), one job that could move, or none.")
    philly.add_argument("--report-interval", type=float, default=None,
                        help="Real seconds (default: half a trace minute).")
    philly.add_argument("--pool-period", type=float, default=None,
                        help="ANALYZER_POOL_PERIOD_S (default: half a trace minute).")
    titan = parser.add_argument_group("titan")
    titan.add_argument("--titan-start", default="2016-07-01")
    titan.add_argument("--titan-days", type=float, default=30.0)
    titan.add_argument("--titan-seconds", type=float, default=60.0,
                       help="Real seconds the window is compressed into.")
    titan.add_argument("--titan-interval", type=float, default=1.0,
                       help="Report interval, real seconds.")
    titan.add_argument("--fault-reports", type=int, default=2,
                       help="Reports each injected failure stays in.")
    titan.add_argument("--titan-load-pct", type=float, default=50.0)
    titan.add_argument("--titan-background", type=int, default=0,
                       help="Healthy nodes added beside the failing ones.")
    titan.add_argument("--titan-max-nodes", type=int, default=10_000)
    return parser.parse_args(argv)


async def main() -> None:
    args = parse_args()
    # aiokafka logs every retried request as a warning or an error (a new topic briefly has
    # no partition leader, and the fetcher says so); what it cannot retry surfaces as an
    # exception, which stops the run. Keep the figures readable.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    # SIGTERM (e.g. from `timeout`) cancels the run, so every `finally` stops what it started.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    print(f"# trace replay, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores), scenarios {' '.join(args.scenarios)}", flush=True)
    results = []
    try:
        if "philly" in args.scenarios:
            result = await replay_philly(args, bootstrap, redis_url)
            series = result.pop("_series")
            if args.series:
                for row in series:
                    print(json.dumps({"series": "philly", **row}))
            print(json.dumps(result), flush=True)
            result["_series"] = series
            results.append(result)
        if "titan" in args.scenarios:
            result = await replay_titan(args, bootstrap, redis_url)
            print(json.dumps(result), flush=True)
            results.append(result)
    except asyncio.CancelledError:
        print("# interrupted: every process started was stopped", flush=True)
        raise SystemExit(143) from None
    for result in results:
        print()
        if result["scenario"] == "philly":
            print(f"philly {result['window'][0]} .. {result['window'][1]}, {result['nodes']} "
                  f"nodes, needs {result['needs']}")
            for line in philly_table(result, args.table_every):
                print(line)
            for need in result["scale_needs"]:
                print(f"  {need['kind']} at trace {need['trace_time']} "
                      f"(minute {need['minute']}, pool {need['pool_pct']}%)")
        else:
            print(f"titan {result['window'][0]} .. {result['window'][1]}, {result['nodes']} "
                  f"nodes")
            for line in titan_table(result):
                print(line)


if __name__ == "__main__":
    asyncio.run(main())
