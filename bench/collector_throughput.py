"""Collector throughput on the real broker and Redis: can it keep up with 5,000 reports/s?

A fleet of N nodes (default 50,000) sends two report intervals. The first one registers
every node (each first report is also a node-state transition); the second is steady state
and is what is measured: the rate at which its samples come out of the collector, from the
first to the last sample by broker timestamps, so process start-up is excluded. Cases with 1
and 2 collector processes run in the same invocation.
Run: `make bench` (or `python -m bench.collector_throughput`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.common import exit_cleanly_on_sigterm
from common.messaging import ensure_topics
from schemas.events.v1 import now_utc
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from tests.contracts.examples import examples
from warden import launcher


def report_bodies(nodes: int, cluster: str, seq: int = 1) -> list[tuple[bytes, bytes]]:
    """One report per node, as (key, value) bytes."""
    template = examples()["node_report"]
    now = now_utc()
    out = []
    for i in range(nodes):
        node = f"node-{i:06d}"
        report = template.model_copy(update={
            "event_id": uuid4(), "occurred_at": now, "cluster_id": cluster,
            "node_id": node, "subject": node, "seq": seq, "faults": [],
        })
        out.append((node.encode(), report.model_dump_json().encode()))
    return out


async def produce(bootstrap: str, topic: str, bodies: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in bodies]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def wait_for_samples(bootstrap: str, topic: str, expected: int, timeout_s: float,
                           after_ms: int) -> tuple[int, float]:
    """(samples published after `after_ms`, seconds from `after_ms` to the last of them).

    Samples travel in batches, so this reads the few batch messages and counts the samples
    in each by a byte search (cheap: the benchmark shares the 2 cores with everything else).
    """
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest",
                                max_partition_fetch_bytes=8 * 1024 * 1024)
    await consumer.start()
    seen, first, last = 0, None, None
    deadline = time.monotonic() + timeout_s
    try:
        while seen < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    if record.timestamp < after_ms:
                        continue
                    seen += record.value.count(b'"report_event_id"')
                    first = record.timestamp if first is None else min(first, record.timestamp)
                    last = record.timestamp if last is None else max(last, record.timestamp)
    finally:
        await consumer.stop()
    # From the start of the round (the first report sent) to the last sample: conservative,
    # as it includes the first batch's whole trip through the collector.
    return seen, ((last or 0) - (after_ms or first or 0)) / 1000.0


async def run_case(bootstrap: str, redis_url: str, nodes: int, processes: int,
                   rounds: list[list[tuple[bytes, bytes]]]) -> dict[str, float]:
    namespace = f"bench{uuid4().hex[:8]}"
    await ensure_topics(bootstrap, namespace)
    await register(redis_url, namespace, "bench", [f"node-{i:06d}" for i in range(nodes)])
    reports = topic_name(Topic.NODE_REPORTS, namespace)
    samples = topic_name(Topic.OPS_SAMPLES, namespace)
    state = Path(tempfile.mkdtemp(prefix="cw-bench-"))
    env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "bench",
           "WARDEN_STATE_DIR": str(state), "WARDEN_LOG_LEVEL": "WARNING",
           # The benchmark's reports are all from one instant; none may go stale mid-run.
           "COLLECTOR_STALE_AFTER_S": "3600"}
    running = []
    for _ in range(processes):
        running += launcher.start_services(state, env, ("collector",))
    try:
        await produce(bootstrap, reports, rounds[0])
        await wait_for_samples(bootstrap, samples, nodes, 600, 0)  # registers every node
        round_start_ms = int(time.time() * 1000)
        produce_s = await produce(bootstrap, reports, rounds[1])
        seen, span_s = await wait_for_samples(bootstrap, samples, nodes, 600, round_start_ms)
    finally:
        launcher.stop_services(running)
    rate = seen / span_s if span_s > 0 else float("nan")
    return {"processes": processes, "reports": nodes, "samples": seen,
            "produce_s": round(produce_s, 2), "span_s": round(span_s, 2),
            "reports_per_s": round(rate)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    rounds = [report_bodies(args.nodes, "bench", seq) for seq in (1, 2)]
    bodies = rounds[1]
    print(f"# collector throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()} ({os.cpu_count()} cores), {args.nodes} reports of "
          f"{sum(len(v) for _, v in bodies) // len(bodies)} bytes")
    for processes in args.processes:
        result = await run_case(bootstrap, redis_url, args.nodes, processes, rounds)
        print(json.dumps(result))


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
