"""Collector throughput on the real broker and Redis: can it keep up with 5,000 reports/s?

A fleet of N nodes (default 50,000) sends two report intervals. The first one registers
every node (each first report is also a node-state transition); the second is steady state
and is what is measured: the rate at which its samples come out of the collector, from the
first to the last sample by broker timestamps, so process start-up is excluded. Cases with 1
and 2 collector processes run in the same invocation, each with signed reports the collector
verifies (as in production) and, with `--mac both` (the default), also with unsigned reports
and verification off, so the cost of checking each node's MAC is one run's difference. The
check's CPU time per report is measured in this process as well (and an Ed25519 signature
check's, the alternative design), since a rate on 2 shared cores moves by more than that.
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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.common import exit_cleanly_on_sigterm
from common.messaging import ensure_topics
from common.reportauth import ReportAuthenticator, enrol_key, ensure_master, master_path
from schemas.events.v1 import now_utc
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from tests.contracts.examples import examples
from warden import launcher

Headers = list[tuple[str, bytes]]
Body = tuple[bytes, bytes, Headers]


def report_bodies(nodes: int, cluster: str, seq: int = 1,
                  master: bytes | None = None) -> list[Body]:
    """One report per node, as (key, value, headers): signed with each node's own key (as
    its agent signs) when `master` is given."""
    template = examples()["node_report"]
    now = now_utc()
    out = []
    for i in range(nodes):
        node = f"node-{i:06d}"
        report = template.model_copy(update={
            "event_id": uuid4(), "occurred_at": now, "cluster_id": cluster,
            "node_id": node, "subject": node, "seq": seq, "faults": [],
        })
        body = report.model_dump_json().encode()
        headers: Headers = []
        if master is not None:
            key = enrol_key(master, cluster, node)
            headers = [(k, v.encode()) for k, v in key.headers(body).items()]
        out.append((node.encode(), body, headers))
    return out


def check_cost_us(bodies: list[Body], master: bytes, cluster: str) -> dict[str, float]:
    """CPU microseconds per report of the collector's MAC check (first sight of a node, which
    derives its key, and steady state), and of verifying an Ed25519 signature instead."""
    sample = bodies[:5_000]
    nodes = [key.decode() for key, _, _ in sample]

    def per_report(check: Callable[[], object]) -> float:
        started = time.process_time()
        check()
        return round(1e6 * (time.process_time() - started) / len(sample), 1)

    authenticator = ReportAuthenticator([master])

    def verify_all() -> None:
        for node, (_, body, headers) in zip(nodes, sample, strict=True):
            if authenticator.refusal(cluster, node, body, headers) is not None:
                raise RuntimeError(f"the benchmark's own report of {node} was refused")

    first = per_report(verify_all)
    steady = per_report(verify_all)
    signer = Ed25519PrivateKey.generate()
    public = signer.public_key()
    signatures = [signer.sign(body) for _, body, _ in sample]
    ed25519 = per_report(lambda: [public.verify(sig, body) for sig, (_, body, _)
                                  in zip(signatures, sample, strict=True)])
    return {"hmac_first_us": first, "hmac_steady_us": steady, "ed25519_verify_us": ed25519,
            "hmac_cpu_share_at_5000_per_s": round(steady * 5_000 / 1e6, 4),
            "ed25519_cpu_share_at_5000_per_s": round(ed25519 * 5_000 / 1e6, 4)}


async def produce(bootstrap: str, topic: str, bodies: list[Body]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [await producer.send(topic, value, key=key, headers=headers or None)
                   for key, value, headers in bodies]
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
                   mac: bool) -> dict[str, float | bool]:
    namespace = f"bench{uuid4().hex[:8]}"
    await ensure_topics(bootstrap, namespace)
    await register(redis_url, namespace, "bench", [f"node-{i:06d}" for i in range(nodes)])
    reports = topic_name(Topic.NODE_REPORTS, namespace)
    samples = topic_name(Topic.OPS_SAMPLES, namespace)
    state = Path(tempfile.mkdtemp(prefix="cw-bench-"))
    # The collector's master, made before it starts, so the reports are signed with the
    # keys it derives (as enrolment gives agents theirs).
    master = ensure_master(master_path("", state)) if mac else None
    rounds = [report_bodies(nodes, "bench", seq, master) for seq in (1, 2)]
    env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "bench",
           "WARDEN_STATE_DIR": str(state), "WARDEN_LOG_LEVEL": "WARNING",
           "WARDEN_REQUIRE_REPORT_MAC": "true" if mac else "false",
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
    return {"processes": processes, "mac": mac, "reports": nodes, "samples": seen,
            "produce_s": round(produce_s, 2), "span_s": round(span_s, 2),
            "reports_per_s": round(rate)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--mac", choices=("on", "off", "both"), default="both",
                        help="Signed reports verified (on), unsigned and unchecked (off), "
                             "or each in turn (both).")
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    macs = {"on": [True], "off": [False], "both": [False, True]}[args.mac]
    sample_master = bytes(range(32))
    bodies = report_bodies(min(args.nodes, 5_000), "bench", 2, sample_master)
    print(f"# collector throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()} ({os.cpu_count()} cores), {args.nodes} reports of "
          f"{sum(len(v) for _, v, _ in bodies) // len(bodies)} bytes")
    print(json.dumps({"check_cost": check_cost_us(bodies, sample_master, "bench")}))
    for processes in args.processes:
        for mac in macs:
            result = await run_case(bootstrap, redis_url, args.nodes, processes, mac)
            print(json.dumps(result))


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
