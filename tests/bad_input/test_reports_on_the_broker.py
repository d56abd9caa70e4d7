"""Every dead-letter reason of the report topic, end to end: bad reports sent on the real
broker to a collector process, each landing in `<topic>.dlt` with its reason, its original
bytes and place; the reports that are only unusable (B12, B13, B14) leave no dead letter and
no sample; the collector stays up and applies the genuine reports between and after them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from schemas.events.v1 import NodeReport, now_utc
from schemas.topics import Topic, dead_letter_name
from services.shared.redis_client import text
from services.shared.registry import register
from tests.bad_input.corpus import BAD_REPORTS, NODE, OTHER_NODE, REPORT_REASONS
from tests.integration import harness
from tests.integration.harness import Record, name, producer, services, stack_env, tap
from tests.integration.test_dead_letters import fresh_report, node_hash

Headers = list[tuple[str, bytes]]
# What the broker and its producers carry at most (message.max.bytes, max_request_size):
# larger bad reports (B9's 100,000 GPUs) cannot be sent at all, B10's case.
BROKER_MESSAGE_LIMIT = 1_000_000
# The report topic's dead-letter reasons docs/reliability.md names (B1..B17, B30, B34); the
# run covers each at least once, and the other schema errors the matrix's cases produce.
DOCUMENTED_REASONS = frozenset({
    "json_invalid", "float_type", "extra_forbidden", "unsupported_version", "finite_number",
    "oversize", "unknown_node", "key_mismatch", "implausible_seq", "unauthenticated_report"})


@dataclass(frozen=True)
class Sent:
    """A record as sent: what it is, its bytes, and its dead-letter reason (None: none)."""

    label: str
    key: bytes
    body: bytes
    headers: Headers
    reason: str | None


def genuine(state_dir: Path, seq_offset_ms: int = 0, **changes: object) -> tuple[NodeReport,
                                                                                 Sent]:
    """node-002's report now, numbered by the clock in ms and signed as its agent does."""
    report = fresh_report()
    report = report.model_copy(update={
        "seq": int(report.occurred_at.timestamp() * 1000) + seq_offset_ms, **changes})
    body, mac = harness.signed(report, state_dir)
    return report, Sent(f"genuine {report.event_id}", NODE.encode(), body, mac, None)


def records(state_dir: Path) -> tuple[list[Sent], NodeReport, NodeReport]:
    """The run's records in order, the first genuine report and the last."""
    first, first_sent = genuine(state_dir)
    bad = [Sent(b.label, b.key, b.body, [], b.reason) for b in BAD_REPORTS
           if len(b.body) < BROKER_MESSAGE_LIMIT]
    stranger = fresh_report("node-666")  # signed with its own key: only its enrolment lacks
    body, mac = harness.signed(stranger, state_dir)
    bad.append(Sent("B15: a node never enrolled", b"node-666", body, mac, "unknown_node"))
    spoofed_body, _ = harness.signed(fresh_report(), state_dir)
    _, other_mac = harness.signed(fresh_report(OTHER_NODE), state_dir)
    bad.append(Sent("B16: node-001's MAC on node-002's report", NODE.encode(), spoofed_body,
                    other_mac, "unauthenticated_report"))
    ahead, _ = genuine(state_dir)
    forged_body, forged_mac = harness.signed(ahead.model_copy(update={"seq": 2**62}),
                                             state_dir)
    bad.append(Sent("B30: a seq ahead of the clock", NODE.encode(), forged_body, forged_mac,
                    "implausible_seq"))
    _, regressed = genuine(state_dir, seq_offset_ms=-60_000)
    _, future = genuine(state_dir, occurred_at=now_utc() + timedelta(hours=1))
    _, stale = genuine(state_dir, occurred_at=now_utc() - timedelta(days=1))
    duplicate = Sent("B14: the first report again", first_sent.key, first_sent.body,
                     first_sent.headers, None)
    last, last_sent = genuine(state_dir, seq_offset_ms=1)
    unusable = [Sent("B13: a regressed seq", regressed.key, regressed.body, regressed.headers,
                     None),
                Sent("B12: dated an hour ahead", future.key, future.body, future.headers, None),
                Sent("B13: a day old", stale.key, stale.body, stale.headers, None),
                duplicate]
    return [first_sent, *bad, *unusable, last_sent], first, last


def alert_of(kind: str) -> Callable[[Record], bool]:
    """True for an alert of `kind` about node-002."""
    def check(record: Record) -> bool:
        alert = json.loads(record.value)
        return bool(alert["kind"] == kind and alert["subject"] == NODE)
    return check


async def test_every_report_dead_letter_reason_end_to_end_B1_to_B17_B24(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path)
    reports_topic = name(Topic.NODE_REPORTS, namespace)
    await register(redis_url, namespace, "itest", [OTHER_NODE, NODE])
    sent, first, last = records(tmp_path)
    reasons = {s.reason for s in sent if s.reason is not None}
    assert DOCUMENTED_REASONS <= reasons <= REPORT_REASONS
    async with services(env, tmp_path, ("collector",)), \
            tap(kafka_bootstrap, name(Topic.OPS_ALERTS, namespace)) as alerts:
        async with producer(kafka_bootstrap) as prod:
            offsets = [await prod.send_and_wait(reports_topic, s.body, key=s.key, partition=0,
                                                headers=s.headers) for s in sent]
        by_offset = {meta.offset: s for meta, s in zip(offsets, sent, strict=True)}

        # The last genuine report is the partition's last record: once its sample is out,
        # the collector has handled every record before it, dead letters first.
        async with tap(kafka_bootstrap, name(Topic.OPS_SAMPLES, namespace)) as samples:
            await samples.wait_for(lambda r: str(last.event_id).encode() in r.value, 90,
                                   "the last genuine report's sample")
            await samples.catch_up()
        async with tap(kafka_bootstrap, dead_letter_name(reports_topic)) as dlt:
            await dlt.catch_up()
        assert sorted(int(dict(r.headers)["dlt-original-offset"]) for r in dlt.records) == [
            meta.offset for meta, s in zip(offsets, sent, strict=True) if s.reason is not None]
        for record in dlt.records:
            headers = {k: v.decode() for k, v in record.headers}
            original = by_offset[int(headers["dlt-original-offset"])]
            assert headers["dlt-reason"] == original.reason, original.label
            assert headers["dlt-original-topic"] == reports_topic
            assert headers["dlt-original-partition"] == "0"
            assert headers["dlt-error"], original.label
            assert (record.key, record.value) == (original.key, original.body), original.label

        # Only the two genuine reports made samples; the duplicate repeats the first one's
        # (the same derived id, which consumers deduplicate).
        made = [(s["event_id"], s["report_event_id"]) for r in samples.records
                for s in json.loads(r.value)["samples"]]
        assert {report for _, report in made} == {str(first.event_id), str(last.event_id)}
        assert len(set(made)) == 2
        node = await node_hash(redis_url, namespace, NODE)
        assert (text(node[b"last_event_id"]), int(text(node[b"seq"]))) == (
            str(last.event_id), last.seq)
        assert await node_hash(redis_url, namespace, "node-666") == {}

        # The forged ones raised one alert each for node-002 (B16, B30).
        for kind in ("unauthenticated_report", "implausible_report"):
            await alerts.wait_for(alert_of(kind), 30, f"the {kind} alert")
