"""Bad input on the real broker: every bad report lands in the dead-letter topic with the
reason, and the collector keeps running and processes the next good report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

from redis.asyncio import Redis

from schemas.events.v1 import NodeReport, now_utc
from schemas.topics import Topic, dead_letter_name
from services.shared.redis_client import Keys, text
from services.shared.registry import register
from tests.contracts.examples import example
from tests.integration import harness
from tests.integration.harness import Record, Tap, name, producer, services, stack_env, tap


def fresh_report(node: str = "node-002") -> NodeReport:
    golden = example("node_report", NodeReport)
    return golden.model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": "itest",
        "node_id": node, "subject": node, "seq": 1,
    })


def mutated(**changes: object) -> bytes:
    data = json.loads(fresh_report().model_dump_json()) | changes
    return json.dumps(data).encode()


def gpu_mutated(**changes: object) -> bytes:
    data = json.loads(fresh_report().model_dump_json())
    data["gpus"][0].update(changes)
    return json.dumps(data).encode().replace(b'"__NAN__"', b"NaN")


async def node_hash(redis_url: str, namespace: str, node: str) -> dict[bytes | str, bytes | str]:
    """The collector's state of a node of the test cluster."""
    redis = Redis.from_url(redis_url)
    try:
        return await redis.hgetall(Keys(namespace).node("itest", node))
    finally:
        await redis.aclose()


def holds_more_than(tap: Tap, count: int) -> Callable[[Record], bool]:
    """True once `tap` has received more than `count` records."""
    def check(_: Record) -> bool:
        return len(tap.records) > count
    return check


BAD_REPORTS: list[tuple[str, bytes, str]] = [
    ("broken json", b'{"event_id": "abc', "json_invalid"),
    ("not utf-8", b"\xff\xfe\xfa", "json_invalid"),
    ("wrong type", gpu_mutated(utilization_pct="high"), "float_type"),
    ("NaN", gpu_mutated(utilization_pct="__NAN__"), "finite_number"),
    ("unknown field", mutated(cmd="rm -rf /"), "extra_forbidden"),
    ("unknown schema version", mutated(schema_version=99), "unsupported_version"),
    ("over the size limit", b'{"pad": "' + b"x" * 70_000 + b'"}', "oversize"),
    ("deep nesting", b"[" * 30_000 + b"]" * 30_000, "json_invalid"),
]


async def test_bad_reports_are_dead_lettered_and_the_next_good_one_is_processed(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path)
    reports_topic = name(Topic.NODE_REPORTS, namespace)
    good = fresh_report()
    stranger = fresh_report("node-666")  # valid, but never enrolled
    await register(redis_url, namespace, "itest", ["node-001", "node-002"])
    async with services(env, tmp_path, ("collector",)):
        async with producer(kafka_bootstrap) as prod:
            sent = []
            for _, body, _ in BAD_REPORTS:
                sent.append(await prod.send_and_wait(reports_topic, body, key=b"node-002",
                                                     partition=0))
            body, mac = harness.signed(good, tmp_path)
            mismatch = await prod.send_and_wait(reports_topic, body, key=b"node-001",
                                                partition=0, headers=mac)
            # Signed with its own key (derivable for any name), so it is its enrolment
            # that is missing.
            stranger_body, stranger_mac = harness.signed(stranger, tmp_path)
            unknown = await prod.send_and_wait(reports_topic, stranger_body, key=b"node-666",
                                               partition=0, headers=stranger_mac)
            await prod.send_and_wait(reports_topic, body, key=b"node-002", partition=0,
                                     headers=mac)

        async with tap(kafka_bootstrap, dead_letter_name(reports_topic)) as dlt:
            for i in range(len(BAD_REPORTS) + 2):
                await dlt.wait_for(holds_more_than(dlt, i), 90, f"dead letter {i}")
        by_offset = {int(dict(r.headers)["dlt-original-offset"]): r for r in dlt.records}
        for (label, body, reason), meta in zip(BAD_REPORTS, sent, strict=True):
            record = by_offset[meta.offset]
            headers = {k: v.decode() for k, v in record.headers}
            assert headers["dlt-reason"] == reason, label
            assert headers["dlt-original-topic"] == reports_topic
            assert headers["dlt-original-partition"] == "0"
            assert headers["dlt-error"], label
            assert record.value == body, label  # the original bytes, for replay
        mismatch_headers = {k: v.decode() for k, v in by_offset[mismatch.offset].headers}
        assert mismatch_headers["dlt-reason"] == "key_mismatch"
        unknown_headers = {k: v.decode() for k, v in by_offset[unknown.offset].headers}
        assert unknown_headers["dlt-reason"] == "unknown_node"
        assert "node-666" in unknown_headers["dlt-error"]

        # The collector survived all of it and processed the good report behind them.
        async with tap(kafka_bootstrap, name(Topic.OPS_SAMPLES, namespace)) as samples:
            record = await samples.wait_for(lambda r: b"node-002" in r.value, 60, "a sample")
        batch = json.loads(record.value)
        assert [s["report_event_id"] for s in batch["samples"]] == [str(good.event_id)]
        node = await node_hash(redis_url, namespace, "node-002")
        assert text(node[b"last_event_id"]) == str(good.event_id)


async def test_reports_with_a_seq_ahead_of_the_clock_are_refused_and_genuine_ones_still_count(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The forgery the security review found: copies of a node's report with a seq far
    ahead of its own made every genuine report look old, and the node went down. Now they
    are dead-lettered as implausible, one alert tells a person, and the node's next genuine
    report is applied."""
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path)
    reports_topic = name(Topic.NODE_REPORTS, namespace)
    await register(redis_url, namespace, "itest", ["node-002"])

    def genuine() -> NodeReport:
        # As an agent numbers its reports: by its clock in milliseconds.
        report = fresh_report()
        return report.model_copy(update={"seq": int(report.occurred_at.timestamp() * 1000)})

    forged = [fresh_report().model_copy(update={"seq": 2**62 + i}) for i in range(3)]
    async with services(env, tmp_path, ("collector",)), \
            tap(kafka_bootstrap, name(Topic.OPS_ALERTS, namespace)) as alerts:
        async with producer(kafka_bootstrap) as prod:
            # Signed with node-002's own key (a node that lost it, or a broken agent):
            # without it they would not get as far as their seq (unauthenticated_report).
            after = genuine()
            for report in [*forged, after]:
                body, mac = harness.signed(report, tmp_path)
                await prod.send_and_wait(reports_topic, body, key=b"node-002", partition=0,
                                         headers=mac)
        async with tap(kafka_bootstrap, dead_letter_name(reports_topic)) as dlt:
            await dlt.wait_for(holds_more_than(dlt, 2), 90, "three dead letters")
        reasons = [dict(r.headers)["dlt-reason"].decode() for r in dlt.records]
        assert reasons == ["implausible_seq"] * 3

        async with tap(kafka_bootstrap, name(Topic.OPS_SAMPLES, namespace)) as samples:
            record = await samples.wait_for(lambda r: b"node-002" in r.value, 60, "a sample")
        batch = json.loads(record.value)
        assert [s["report_event_id"] for s in batch["samples"]] == [str(after.event_id)]
        alert = await alerts.wait_for(lambda r: b"implausible_report" in r.value, 30,
                                      "the alert")
        await alerts.catch_up()
    raised = [r for r in alerts.records if b"implausible_report" in r.value]
    assert len(raised) == 1  # one a window, however many forgeries
    assert json.loads(alert.value)["subject"] == "node-002"
    node = await node_hash(redis_url, namespace, "node-002")
    assert text(node[b"last_event_id"]) == str(after.event_id)
    assert int(text(node[b"seq"])) == after.seq
