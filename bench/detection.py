"""Detection time: from a fault on a real agent to the ops need it raises.

Three cases, each on its own fleet of real agent processes (`python -m agent`) against the
real collector and analyzer on the real broker and Redis:

* dead agent: SIGKILL; detected when the heartbeat misses the grace period;
* fatal XID: XID 79 (GPU fallen off the bus) injected into the agent's device;
* hung job: the agent's training job is frozen (SIGSTOP); the agent reports it hung after
  AGENT_HUNG_AFTER_S without progress.

Faults are injected on different nodes at random moments of the report interval; the time
is measured from the injection to the offline need's timestamp on its topic (both wall-clock
times of this machine). Run:
`python -m bench.detection` (see --help); figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

from aiokafka import AIOKafkaConsumer

from agent import fleet
from bench.common import exit_cleanly_on_sigterm, percentile
from common.messaging import ensure_topics
from common.signing import ensure_signer_keys
from schemas.events.v1 import OpsNeed
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from warden import launcher

Inject = Callable[[Path, str], None]


def kill(state: Path, node: str) -> None:
    fleet.kill_agent(state, node)


def xid(state: Path, node: str) -> None:
    fleet.inject_fault(state, node, xid=[79])


def hang(state: Path, node: str) -> None:
    fleet.inject_fault(state, node, hung_job=True)


CASES: dict[str, tuple[Inject, str]] = {
    "dead_agent": (kill, ""),
    "fatal_xid": (xid, ""),
    "hung_job": (hang, "train"),
}


async def run_case(case: str, trials: int, interval: float, settings: dict[str, str],
                   bootstrap: str, redis_url: str) -> dict[str, object]:
    inject, jobs = CASES[case]
    namespace = f"det{uuid4().hex[:8]}"
    state = Path(tempfile.mkdtemp(prefix=f"cw-det-{case}-"))
    env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "bench",
           "WARDEN_STATE_DIR": str(state), "WARDEN_LOG_LEVEL": "WARNING",
           "AGENT_JOBS": jobs, **settings}
    await ensure_topics(bootstrap, namespace)
    trusted = ensure_signer_keys(state / "keys")
    services = launcher.start_services(state, env, ("collector", "analyzer"))
    agents = fleet.fleet_up(trials, 1, "bench", namespace, state, env, trusted, interval)
    nodes = [a.node_id for a in agents]
    await register(redis_url, namespace, "bench", nodes)
    consumer = AIOKafkaConsumer(topic_name(Topic.OPS_NEEDS, namespace),
                                bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    injected: dict[str, float] = {}
    detected: dict[str, float] = {}
    try:
        await asyncio.sleep(max(8.0, 4 * interval))  # every agent up and reporting
        rng = random.Random(7)
        for node in nodes:
            # A random moment of the report interval, so the figures cover the phase.
            await asyncio.sleep(rng.uniform(0.0, interval))
            injected[node] = time.time()
            inject(state, node)
        deadline = time.monotonic() + 180
        while len(detected) < len(nodes) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for record in records:
                    need = OpsNeed.model_validate_json(record.value)
                    if need.kind == "offline" and need.target in injected:
                        # The broker's timestamp of the need, not when this loop read it
                        # (it only starts reading once every fault is injected).
                        detected.setdefault(need.target, record.timestamp / 1000.0)
    finally:
        await consumer.stop()
        fleet.fleet_down(state)
        launcher.stop_services(services)
    delays = [detected[n] - injected[n] for n in nodes if n in detected]
    return {
        "case": case, "trials": len(nodes), "detected": len(delays),
        "p50_s": round(statistics.median(delays), 2) if delays else None,
        "p99_s": round(percentile(delays, 0.99), 2) if delays else None,
        "max_s": round(max(delays), 2) if delays else None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="Nodes (one fault each) per case.")
    parser.add_argument("--interval", type=float, default=2.0, help="Report interval, s.")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    # Grace: 3 report intervals (a dead node is then down within 3 intervals plus a sweep).
    settings = {
        "COLLECTOR_DOWN_AFTER_S": str(3 * args.interval),
        "COLLECTOR_PROBE_PERIOD_S": "30",
        "COLLECTOR_PROBE_DEADLINE_S": "5",
        "AGENT_HUNG_AFTER_S": "5",
    }
    print(f"# detection, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores), report interval {args.interval}s, settings {settings}")
    for case in args.cases:
        result = await run_case(case, args.trials, args.interval, settings, bootstrap,
                                redis_url)
        print(json.dumps(result))


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
