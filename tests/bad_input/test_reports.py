"""Bad reports (B1..B17, B24 on the report topic): first at the strict decoder every consumer
of the topic uses (`parse_event`), then at the collector's handler on the real redis-server,
where a refused report must leave the node's state, the enrolment and the published samples
as they were. tests/bad_input/test_reports_on_the_broker.py sends them through a collector
process on the real broker."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from common.errors import PermanentError
from common.messaging import parse_event
from schemas.envelope import Envelope
from schemas.events.v1 import Command, NodeReport, TaskControl, now_utc
from services.shared.redis_client import Keys
from tests.bad_input.collector_harness import CollectorHarness, collector_harness
from tests.bad_input.corpus import (
    BAD_REPORTS,
    EVENT_LIMIT,
    NODE,
    OTHER_NODE,
    BadInput,
    cases,
    check_golden_report_is_valid,
    good_report,
    nested,
    refusal,
)
from tests.contracts.examples import example
from tests.integration.test_dead_letters import fresh_report

# ---------------------------------------------------------------- the strict decoder


@pytest.mark.parametrize("bad", BAD_REPORTS, ids=lambda bad: bad.label)
def test_each_bad_report_is_refused_with_its_reason_B1_to_B11_B17_B24(bad: BadInput) -> None:
    """Every consumer of the report topic decodes with parse_event: each bad report is a
    permanent error with the matrix's reason, never another exception (which would be
    dead-lettered as `unhandled_error`)."""
    check_golden_report_is_valid()
    assert refusal(NodeReport, bad.body, bad.key, EVENT_LIMIT) == bad.reason, bad.label


def test_the_size_guard_refuses_before_any_parsing_B9() -> None:
    """B9: a body over the limit is refused for its size alone, before a byte of it is parsed
    (garbage and a valid report of the same size get the same answer), and the reason says
    how large it was."""
    limit = EVENT_LIMIT
    for body in (b"\xff" * (limit + 1), good_report() + b" " * (limit + 1)):
        with pytest.raises(PermanentError) as refused:
            parse_event(NodeReport, body, NODE.encode(), limit)
        assert refused.value.reason == "oversize"
        assert str(len(body)) in refused.value.detail
    # A body exactly at the limit is parsed (and then judged on its content).
    assert refusal(NodeReport, good_report(), NODE.encode(), len(good_report())) is None


def test_100k_deep_nesting_is_json_invalid_not_a_recursion_error_B11() -> None:
    """B11: 100,000 levels (200 KB, so under a limit that lets it through) end as pydantic's
    json_invalid; the stdlib's json.loads would raise RecursionError here."""
    body = nested(100_000)
    assert refusal(NodeReport, body, NODE.encode(), len(body)) == "json_invalid"
    # Over the real limit the size guard answers first.
    assert refusal(NodeReport, body, NODE.encode(), EVENT_LIMIT) == "oversize"


def test_a_schema_version_that_only_equals_1_is_unsupported_B6() -> None:
    """B6, strictly: the contract's models coerce nothing (schemas/envelope.py STRICT), so
    `"schema_version": true` or `1.0` is not version 1 and must be dead-lettered
    `unsupported_version` like 99, on every topic."""
    models: list[tuple[str, type[Envelope]]] = [
        ("node_report", NodeReport), ("command", Command), ("task_control", TaskControl)]
    answers: dict[str, str | None] = {}
    for kind, model in models:
        event = example(kind, model)
        data = json.loads(event.model_dump_json())
        assert refusal(model, json.dumps(data).encode(), event.subject.encode(),
                       EVENT_LIMIT) is None
        for version in (True, 1.0, 99, "1"):
            body = json.dumps(data | {"schema_version": version}).encode()
            answers[f"{kind} {version!r}"] = refusal(model, body, event.subject.encode(),
                                                     EVENT_LIMIT)
    not_refused = [version for version, reason in answers.items()
                   if reason != "unsupported_version"]
    assert not_refused == [], f"taken as version 1: {not_refused}"


# ---------------------------------------------------------------- the collector's handler


@pytest.fixture
async def bench(redis: Redis, keys: Keys) -> CollectorHarness:
    return await collector_harness(redis, keys, [OTHER_NODE, NODE])


def signed_now(bench: CollectorHarness, seq_offset_ms: int = 0,
               node: str = NODE) -> tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]:
    """A genuine report of `node` now, numbered by the clock in ms as agents do it."""
    report = fresh_report(node)
    seq = int(report.occurred_at.timestamp() * 1000) + seq_offset_ms
    return bench.sign(report.model_copy(update={"seq": seq}))


async def test_a_bad_report_is_dead_lettered_counted_and_the_next_one_applied_B1(
        bench: CollectorHarness) -> None:
    """B1: the broken report of a batch is dead-lettered with its original bytes and offset,
    the `warden.collector.reports` metric counts it, and the good report behind it is applied."""
    broken = cases(BAD_REPORTS, "B1")[0]
    good = signed_now(bench)
    await bench.feed((broken.key, broken.body), good)
    [letter] = bench.letters
    assert (letter.reason, letter.offset, letter.value) == ("json_invalid", 0, broken.body)
    good_report_id = str(NodeReport.model_validate_json(good[1]).event_id)
    assert [report for _, report in bench.samples()] == [good_report_id]
    assert (await bench.node(NODE))["last_event_id"] == good_report_id
    counted = bench.counted()
    assert (counted["dead_letter:json_invalid"], counted["ok"]) == (1, 1)


@pytest.mark.parametrize("bad", [b for b in BAD_REPORTS if b.case in (
    "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B11", "B17", "B24")], ids=lambda b: b.label)
async def test_a_refused_report_changes_no_node_state_B2_to_B24(
        bench: CollectorHarness, bad: BadInput) -> None:
    """Each refused report is dead-lettered with its reason and nothing of it is read: no
    sample, no state change, no node hash."""
    await bench.feed((bad.key, bad.body))
    assert bench.reasons() == [bad.reason]
    assert bench.bus.published == []
    assert await bench.node(NODE) == {}
    assert await bench.node(OTHER_NODE) == {}


async def test_a_report_from_the_future_is_kept_out_of_decisions_B12(
        bench: CollectorHarness) -> None:
    """B12: a report dated an hour ahead (a skewed clock) is counted `future` and not used:
    no sample, no state, and no dead letter either (it is not malformed). The project raises
    no alert for it (docs/reliability.md promises only that it stays out of decisions)."""
    ahead = fresh_report().model_copy(update={"occurred_at": now_utc() + timedelta(hours=1)})
    await bench.feed(bench.sign(ahead))
    assert (bench.letters, bench.bus.published) == ([], [])
    assert await bench.node(NODE) == {}
    assert bench.counted()["future"] == 1


async def test_a_stale_report_and_a_regressed_seq_are_kept_out_of_decisions_B13(
        bench: CollectorHarness) -> None:
    """B13: a report a day old is counted `stale`; one whose seq is below the node's last
    applied one is `old`. Neither makes a sample or moves the node's state."""
    first = signed_now(bench)
    await bench.feed(first)
    before = await bench.node(NODE)
    published = len(bench.bus.published)
    stale = fresh_report().model_copy(update={"occurred_at": now_utc() - timedelta(days=1)})
    regressed = signed_now(bench, seq_offset_ms=-60_000)
    await bench.feed(bench.sign(stale), regressed)
    assert bench.letters == []
    assert len(bench.bus.published) == published
    assert await bench.node(NODE) == before
    counted = bench.counted()
    assert (counted["stale"], counted["old"], counted["ok"]) == (1, 1, 1)


async def test_a_duplicate_report_id_is_applied_once_B14(bench: CollectorHarness) -> None:
    """B14: the same report again (a redelivery) is a `replay`: the node's state is not
    touched a second time, and what it publishes again carries the same derived event id,
    which every consumer deduplicates."""
    report = signed_now(bench)
    await bench.feed(report)
    applied = await bench.node(NODE)
    await bench.feed(report, report)
    assert await bench.node(NODE) == applied
    ids = bench.samples()
    assert len(ids) == 3
    assert len(set(ids)) == 1  # one sample, three deliveries of it
    assert bench.counted()["replay"] == 2
    assert bench.letters == []


async def test_a_node_never_enrolled_is_quarantined_not_enrolled_B15(
        bench: CollectorHarness) -> None:
    """B15: a correctly signed report of a node the cluster never enrolled is dead-lettered
    `unknown_node`; the node is not enrolled by it, and no state or sample follows."""
    stranger = fresh_report("node-666")
    await bench.feed(bench.sign(stranger))
    assert bench.reasons() == ["unknown_node"]
    assert "node-666" not in await bench.enrolled()
    assert await bench.node("node-666") == {}
    assert bench.bus.published == []


async def test_a_report_spoofing_another_node_is_refused_and_alerted_B16(
        bench: CollectorHarness) -> None:
    """B16: the topics are shared, so a node can write a report in another's name. Signed
    with its own key (node-001's MAC on node-002's report), it is dead-lettered
    `unauthenticated_report` before anything is read, with one alert for node-002; under its
    own key as Kafka key, `key_mismatch`. node-002's state is untouched either way."""
    spoofed = fresh_report(NODE)
    _, body, headers = bench.sign(spoofed, as_node=OTHER_NODE)
    await bench.feed((NODE.encode(), body, headers), (OTHER_NODE.encode(), body, headers))
    assert bench.reasons() == ["unauthenticated_report", "key_mismatch"]
    assert await bench.node(NODE) == {}
    [alert] = bench.alerts()
    assert (alert.kind, alert.subject) == ("unauthenticated_report", NODE)
    assert bench.samples() == []
    assert bench.state_changes() == []


async def test_a_key_that_is_not_the_subject_is_refused_B17(bench: CollectorHarness) -> None:
    """B17: node-002's genuine, correctly signed report under the Kafka key node-001 is
    dead-lettered `key_mismatch`, and neither node's state moves."""
    key, body, headers = signed_now(bench)
    assert key == NODE.encode()
    await bench.feed((OTHER_NODE.encode(), body, headers))
    assert bench.reasons() == ["key_mismatch"]
    assert (await bench.node(NODE), await bench.node(OTHER_NODE)) == ({}, {})
