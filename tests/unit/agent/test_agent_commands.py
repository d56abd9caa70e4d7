"""Command verification order and actions (docs/reliability.md §Command verification):
every rejection, every action."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.commands import CommandExecutor
from agent.faults import FaultPlan, write_faults
from agent.journal import Journal
from common.errors import PermanentError
from common.signing import CommandVerifier, KeyRegistry, b64url
from schemas.events.v1 import (
    Cancel,
    Command,
    DrainNode,
    MigrateJob,
    OfflineNode,
    OnlineNode,
    ProbeNode,
    QueryStatus,
    SetReportInterval,
    SetResources,
    StartJob,
    StopJob,
    UndrainNode,
)

NODE = "node-001"


def signed_raw(centre: Any, body: dict[str, Any], subject: str = NODE) -> Command:
    """A command whose payload bytes are whatever the test wants, correctly signed."""
    raw = json.dumps(body).encode()
    good: Command = centre.command()
    key: Ed25519PrivateKey = centre.signer.key
    return good.model_copy(
        update={"payload": b64url(raw), "sig": b64url(key.sign(raw)), "subject": subject}
    )


def mode_of(journal: Journal) -> str:
    """The journaled mode, read afresh (a plain str, so checks in sequence type-check)."""
    return journal.mode


# ---------------------------------------------------------------- not ours


def test_command_for_another_node_is_ignored(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    other = centre.command(DrainNode(node_id="node-002"), node="node-002")
    assert executor.handle(other, now) is None
    assert journal.command_count() == 0


def test_command_for_another_cluster_is_ignored(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    command = centre.sign(centre.payload(cluster="other-cluster"))
    assert executor.handle(command, now) is None
    assert journal.command_count() == 0


def test_command_signed_for_the_same_node_name_in_another_cluster_is_rejected(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    # Envelope readdressed to this cluster, signed payload for another cluster's node-001:
    # its seq is that cluster's, and it must not advance (or be checked against) ours.
    command = centre.sign(centre.payload(cluster="other-cluster", seq=50))
    readdressed = command.model_copy(update={"cluster_id": executor.cluster_id})
    result = executor.handle(readdressed, now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "wrong_audience")
    assert journal.mode == "active"
    assert journal.last_seq is None


# ---------------------------------------------------------------- key and signature


def test_bad_signature_raises_permanent_error(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    command = centre.command()
    forged = Ed25519PrivateKey.generate().sign(b"something else")
    tampered = command.model_copy(update={"sig": b64url(forged)})
    with pytest.raises(PermanentError) as caught:
        executor.handle(tampered, now)
    assert caught.value.reason == "bad_signature"
    assert journal.command_count() == 0
    assert journal.mode == "active"


def test_payload_changed_after_signing_is_a_bad_signature(
    executor: CommandExecutor, centre: Any, now: datetime
) -> None:
    command = centre.command(OfflineNode(node_id=NODE))
    other = centre.command(DrainNode(node_id=NODE))
    spliced = command.model_copy(update={"payload": other.payload})
    with pytest.raises(PermanentError, match="bad_signature"):
        executor.handle(spliced, now)


def test_unknown_kid_raises_permanent_error(
    centre: Any, journal: Journal, now: datetime
) -> None:
    # No trusted keys at all: every command is refused before anything is parsed.
    executor = CommandExecutor(NODE, "local", CommandVerifier(KeyRegistry()), journal)
    with pytest.raises(PermanentError) as caught:
        executor.handle(centre.command(), now)
    assert caught.value.reason == "unknown_kid"
    assert journal.command_count() == 0


def test_invalid_payload_with_a_command_id_is_rejected(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    command_id = uuid4()
    payload = json.loads(centre.payload().model_dump_json())
    payload["command_id"] = str(command_id)
    payload["action"] = {"action": "exec_shell", "node_id": NODE}
    result = executor.handle(signed_raw(centre, payload), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "invalid_payload")
    assert result.command_id == command_id
    assert result.outputs["error"] == "union_tag_invalid"
    assert journal.mode == "active"


def test_invalid_payload_without_a_command_id_is_dead_lettered(
    executor: CommandExecutor, centre: Any, now: datetime
) -> None:
    with pytest.raises(PermanentError):
        executor.handle(signed_raw(centre, {"hello": "world"}), now)


# ---------------------------------------------------------------- audience and time


def test_wrong_audience_is_rejected(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    # Envelope addressed to us, signed payload for node-002: the signed part wins.
    command = centre.command(DrainNode(node_id="node-002"), node="node-002")
    readdressed = command.model_copy(update={"subject": NODE})
    result = executor.handle(readdressed, now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "wrong_audience")
    assert journal.mode == "active"
    assert journal.last_seq is None


@pytest.mark.parametrize(
    ("offset_s", "ttl_s", "reason"),
    [
        (60 + 30 + 1, 60, "expired"),  # past expires_at + leeway
        (-30 - 1, 60, "not_yet_valid"),  # before issued_at - leeway
        (0, 301, "ttl_too_long"),
    ],
)
def test_time_window_rejections(
    executor: CommandExecutor,
    centre: Any,
    journal: Journal,
    now: datetime,
    offset_s: float,
    ttl_s: float,
    reason: str,
) -> None:
    command = centre.command(ttl_s=ttl_s)
    result = executor.handle(command, now + timedelta(seconds=offset_s))
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", reason)
    assert result.action == "drain_node"
    assert journal.mode == "active"
    assert journal.last_seq is None  # a rejected command does not consume its seq


@pytest.mark.parametrize("offset_s", [60 + 30, -30])
def test_leeway_edges_are_accepted(
    executor: CommandExecutor, centre: Any, now: datetime, offset_s: float
) -> None:
    result = executor.handle(centre.command(ttl_s=60), now + timedelta(seconds=offset_s))
    assert result is not None
    assert result.outcome == "succeeded"


# ---------------------------------------------------------------- replay, seq, epoch


def test_duplicate_returns_cached_result_and_executes_nothing(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    drain = centre.command(DrainNode(node_id=NODE), seq=1)
    first = executor.handle(drain, now)
    assert first is not None
    assert first.outcome == "succeeded"
    undrain = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2), now)
    assert undrain is not None
    assert journal.mode == "active"

    again = executor.handle(drain, now + timedelta(seconds=5))
    assert again is not None
    assert again.duplicate is True
    assert again.command_id == first.command_id
    assert (again.outcome, again.reason, again.outputs) == (
        first.outcome, first.reason, first.outputs
    )
    assert again.event_id != first.event_id  # a new event, so consumers do not drop it
    assert journal.mode == "active"  # the drain did not run a second time
    assert journal.command_count() == 2
    assert journal.last_seq == 2


def test_duplicate_is_answered_after_a_restart(
    centre: Any, state_dir: Path, now: datetime
) -> None:
    first_journal = Journal.open(state_dir)
    drain = centre.command(seq=1)
    CommandExecutor(NODE, "local", centre.verifier, first_journal).handle(drain, now)
    first_journal.close()

    reopened = Journal.open(state_dir)
    try:
        executor = CommandExecutor(NODE, "local", centre.verifier, reopened)
        replay = executor.handle(drain, now)
        assert replay is not None
        assert replay.duplicate
        # A fresh command id with an old seq is a replay too (B19).
        old_seq = executor.handle(centre.command(OnlineNode(node_id=NODE), seq=1), now)
        assert old_seq is not None
        assert (old_seq.outcome, old_seq.reason) == ("rejected", "stale_seq")
        assert reopened.mode == "draining"
    finally:
        reopened.close()


def test_stale_seq_is_rejected_and_a_gap_is_allowed(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    assert executor.handle(centre.command(seq=5), now) is not None
    # A seq already taken, however new the command id.
    result = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=5), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "stale_seq")
    assert journal.mode == "draining"
    gap = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=42), now)
    assert gap is not None
    assert gap.outcome == "succeeded"
    assert journal.last_seq == 42


def test_a_seq_that_arrives_late_is_taken_once_within_the_window(
    centre: Any, journal: Journal, state_dir: Path, now: datetime
) -> None:
    """Two senders took seqs 7 and 8 and 8 arrived first: 7 is still taken, once; a seq
    further back than the window is not (docs/reliability.md S25)."""
    executor = CommandExecutor(NODE, "local", centre.verifier, journal, seq_window=4)
    assert executor.handle(centre.command(seq=8), now) is not None
    late = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=7), now)
    assert late is not None
    assert (late.outcome, late.reason) == ("succeeded", "")
    assert mode_of(journal) == "active"
    assert journal.last_seq == 8  # the high-water mark stays
    again = executor.handle(centre.command(DrainNode(node_id=NODE), seq=7), now)
    assert again is not None
    assert (again.outcome, again.reason) == ("rejected", "stale_seq")
    for seq in (4, 0):  # 8 - 4: outside the window
        old = executor.handle(centre.command(DrainNode(node_id=NODE), seq=seq), now)
        assert old is not None
        assert (old.outcome, old.reason) == ("rejected", "stale_seq")
    # A rejected seq was never used: it is taken when a real command brings it.
    assert executor.handle(centre.command(DrainNode(node_id=NODE), seq=6), now) is not None
    assert mode_of(journal) == "draining"


def test_a_window_of_zero_keeps_seqs_strictly_increasing(
    centre: Any, journal: Journal, now: datetime
) -> None:
    executor = CommandExecutor(NODE, "local", centre.verifier, journal, seq_window=0)
    assert executor.handle(centre.command(seq=8), now) is not None
    late = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=7), now)
    assert late is not None
    assert (late.outcome, late.reason) == ("rejected", "stale_seq")


def test_a_late_seq_is_still_fenced_by_its_epoch(
    centre: Any, journal: Journal, now: datetime
) -> None:
    executor = CommandExecutor(NODE, "local", centre.verifier, journal, seq_window=16)
    assert executor.handle(centre.command(seq=8, epoch=5), now) is not None
    late = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=7, epoch=4), now)
    assert late is not None
    assert (late.outcome, late.reason) == ("rejected", "stale_epoch")


def test_stale_epoch_is_rejected(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    assert executor.handle(centre.command(seq=1, epoch=2), now) is not None
    old_leader = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2, epoch=1), now)
    assert old_leader is not None
    assert (old_leader.outcome, old_leader.reason) == ("rejected", "stale_epoch")
    assert journal.mode == "draining"
    assert journal.last_seq == 1  # the rejected seq is still free for the current leader
    same_epoch = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2, epoch=2), now)
    assert same_epoch is not None
    assert same_epoch.outcome == "succeeded"
    assert journal.max_epoch == 2


def test_a_job_action_is_fenced_by_its_job_not_by_the_node(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    # Two tasks move different jobs through one node at once, each under its own epoch: the
    # later epoch of one must not make the other's commands stale.
    first = executor.handle(centre.command(StopJob(node_id=NODE, job_id="a"), seq=1, epoch=5),
                            now)
    assert first is not None
    assert first.reason != "stale_epoch"
    assert journal.max_epoch_for("job:a") == 5
    assert journal.max_epoch is None
    other_job = executor.handle(
        centre.command(StopJob(node_id=NODE, job_id="b"), seq=2, epoch=3), now)
    assert other_job is not None
    assert other_job.reason != "stale_epoch"
    node_action = executor.handle(centre.command(seq=3, epoch=1), now)
    assert node_action is not None
    assert node_action.outcome == "succeeded"
    # The same job under an older epoch is an executor that lost its lease.
    stale = executor.handle(centre.command(StopJob(node_id=NODE, job_id="a"), seq=4, epoch=4),
                            now)
    assert stale is not None
    assert (stale.outcome, stale.reason) == ("rejected", "stale_epoch")


def test_rejection_never_overwrites_an_executed_result(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    payload = centre.payload(seq=1)
    executor.handle(centre.sign(payload), now)
    # The same payload signed again by a signer that may not drain: refused before the
    # journal is read, and journaled as a rejection of an id already there.
    resigned = executor.handle(centre.sign(payload, role="collector"), now)
    assert resigned is not None
    assert resigned.reason == "action_not_allowed"
    cached = journal.cached_result(payload.command_id)
    assert cached is not None
    assert cached.outcome == "succeeded"


# ---------------------------------------------------------------- actions


def test_drain_then_offline(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    drain = executor.handle(centre.command(DrainNode(node_id=NODE), seq=1), now)
    assert drain is not None
    assert drain.outcome == "succeeded"
    assert drain.outputs == {"mode": "draining", "previous_mode": "active", "changed": True}
    assert drain.node_id == NODE
    assert drain.subject == NODE
    assert mode_of(journal) == "draining"

    again = executor.handle(centre.command(DrainNode(node_id=NODE), seq=2), now)
    assert again is not None
    assert again.outcome == "succeeded"
    assert again.outputs["changed"] is False  # drain is "ensure drained"

    offline = executor.handle(centre.command(OfflineNode(node_id=NODE), seq=3), now)
    assert offline is not None
    assert offline.outcome == "succeeded"
    assert offline.outputs["mode"] == "offline"
    assert mode_of(journal) == "offline"

    online = executor.handle(centre.command(OnlineNode(node_id=NODE), seq=4), now)
    assert online is not None
    assert online.outputs["mode"] == "active"
    assert journal.mode == "active"


def test_offline_before_drain_fails(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    result = executor.handle(centre.command(OfflineNode(node_id=NODE)), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("failed", "not_drained")
    assert journal.mode == "active"
    assert journal.command_count() == 1


def test_dry_run_changes_nothing(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    dry = executor.handle(centre.command(DrainNode(node_id=NODE), seq=1, dry_run=True), now)
    assert dry is not None
    assert dry.outcome == "succeeded"
    assert dry.outputs["dry_run"] is True
    assert dry.outputs["target_mode"] == "draining"
    assert journal.mode == "active"

    # The precondition is still checked.
    dry_offline = executor.handle(
        centre.command(OfflineNode(node_id=NODE), seq=2, dry_run=True), now
    )
    assert dry_offline is not None
    assert (dry_offline.outcome, dry_offline.reason) == ("failed", "not_drained")
    assert journal.mode == "active"


def test_query_status_returns_the_journaled_result(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    drain = centre.command(seq=1)
    drained = executor.handle(drain, now)
    assert drained is not None
    query = executor.handle(
        centre.command(QueryStatus(node_id=NODE, command_id=drained.command_id), seq=2), now
    )
    assert query is not None
    assert query.action == "query_status"
    assert query.outcome == "succeeded"
    assert query.outputs["queried_command_id"] == str(drained.command_id)
    assert query.outputs["queried_action"] == "drain_node"
    assert query.outputs["mode"] == "draining"
    assert journal.mode == "draining"


def test_query_status_of_an_unknown_command(
    executor: CommandExecutor, centre: Any, now: datetime
) -> None:
    missing = uuid4()
    query = executor.handle(centre.command(QueryStatus(node_id=NODE, command_id=missing)), now)
    assert query is not None
    assert (query.outcome, query.reason) == ("unknown", "not_in_journal")
    assert query.outputs["queried_command_id"] == str(missing)


@pytest.mark.parametrize(
    "action",
    [
        StartJob(node_id=NODE, job_id="j1"),
        StopJob(node_id=NODE, job_id="j1"),
        MigrateJob(node_id=NODE, job_id="j1", to_node_id="node-002"),
        SetResources(node_id=NODE, job_id="j1", gpus=1, memory_mib=1024),
    ],
    ids=lambda action: action.action,
)
def test_job_actions_need_a_job_runner(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime, action: Any
) -> None:
    # The fixture's executor drives no jobs (tests/unit/agent/test_agent_actions.py does).
    result = executor.handle(centre.command(action), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("failed", "not_supported")
    assert result.outputs == {"job_id": "j1"}
    assert journal.mode == "active"


def test_cancel_of_nothing_running(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    drained = executor.handle(centre.command(seq=1), now)
    assert drained is not None
    missing = uuid4()
    results = [
        executor.handle(centre.command(Cancel(node_id=NODE, command_id=target), seq=1), now)
        for target in (drained.command_id, missing)
    ]
    # Outside the ordering (seq 1 again is no reason to refuse it), and a no-op.
    assert [(r.outcome, r.outputs) for r in results if r] == [
        ("succeeded", {"queried_command_id": str(drained.command_id), "cancelled": False,
                       "queried_outcome": "succeeded"}),
        ("succeeded", {"queried_command_id": str(missing), "cancelled": False,
                       "queried_outcome": "not_in_journal"}),
    ]
    assert journal.last_seq == 1
    assert journal.mode == "draining"


def test_injected_failure(
    executor: CommandExecutor, centre: Any, journal: Journal, state_dir: Path, now: datetime
) -> None:
    write_faults(state_dir, FaultPlan(fail_actions=["drain_node"]))
    result = executor.handle(centre.command(seq=1), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("failed", "injected_failure")
    assert journal.mode == "active"
    # Other actions are unaffected.
    online = executor.handle(centre.command(OnlineNode(node_id=NODE), seq=2), now)
    assert online is not None
    assert online.outcome == "succeeded"


def test_every_answer_is_journaled_before_it_is_returned(
    executor: CommandExecutor, centre: Any, state_dir: Path, now: datetime
) -> None:
    results = [
        executor.handle(centre.command(seq=1), now),
        executor.handle(centre.command(OfflineNode(node_id=NODE), seq=1), now),  # stale_seq
        executor.handle(centre.command(seq=2, ttl_s=900), now),  # ttl_too_long
    ]
    # A second connection sees them: they are committed, not merely buffered.
    other = Journal.open(state_dir)
    try:
        for result in results:
            assert result is not None
            cached = other.cached_result(result.command_id)
            assert cached == result
        assert other.mode == "draining"
    finally:
        other.close()


# ---------------------------------------------------------------- report interval and probe


def test_set_report_interval_is_journaled_and_survives_a_restart(
    executor: CommandExecutor, centre: Any, journal: Journal, state_dir: Path, now: datetime
) -> None:
    assert executor.interval_s == 2.0  # nothing journaled: the configured interval
    result = executor.handle(
        centre.command(SetReportInterval(node_id=NODE, interval_s=30.0), seq=1), now
    )
    assert result is not None
    assert (result.action, result.outcome) == ("set_report_interval", "succeeded")
    assert result.outputs == {"interval_s": 30.0, "previous_interval_s": 2.0, "changed": True}
    assert executor.interval_s == 30.0
    assert journal.mode == "active"

    reopened = Journal.open(state_dir)
    try:
        restarted = CommandExecutor(NODE, "local", centre.verifier, reopened,
                                    default_interval_s=2.0)
        assert restarted.interval_s == 30.0  # the centre's value wins over the configured one
        probe = restarted.handle(centre.command(ProbeNode(node_id=NODE), seq=2), now)
        assert probe is not None
        assert probe.outputs == {"mode": "active", "interval_s": 30.0}
    finally:
        reopened.close()


@pytest.mark.parametrize("interval_s", [0.49, 3_600.5, 0.0])
def test_set_report_interval_out_of_range_is_an_invalid_payload(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime, interval_s: float
) -> None:
    payload = json.loads(centre.payload().model_dump_json())
    payload["action"] = {"action": "set_report_interval", "node_id": NODE,
                         "interval_s": interval_s}
    result = executor.handle(signed_raw(centre, payload), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", "invalid_payload")
    assert journal.interval_s is None


def test_probe_node_answers_at_once(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    executor.handle(centre.command(DrainNode(node_id=NODE), seq=1), now)
    result = executor.handle(centre.command(ProbeNode(node_id=NODE), seq=2), now)
    assert result is not None
    assert (result.action, result.outcome, result.reason) == ("probe_node", "succeeded", "")
    assert result.outputs == {"mode": "draining", "interval_s": 2.0}
    assert journal.cached_result(result.command_id) == result  # journaled like any command
    assert journal.last_seq == 1  # outside the command ordering: it neither needs nor moves it
    assert journal.mode == "draining"  # a probe changes nothing


@pytest.mark.parametrize(
    "action",
    [ProbeNode(node_id=NODE), SetReportInterval(node_id=NODE, interval_s=10.0)],
    ids=lambda action: action.action,
)
def test_new_actions_follow_the_verification_order(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime, action: Any
) -> None:
    # Signature first: a forged one is dead-lettered, nothing journaled.
    forged = centre.command(action, seq=1).model_copy(
        update={"sig": b64url(Ed25519PrivateKey.generate().sign(b"x"))}
    )
    with pytest.raises(PermanentError, match="bad_signature"):
        executor.handle(forged, now)
    # Audience, then expiry.
    other_node = type(action).model_validate(action.model_dump() | {"node_id": "node-002"})
    elsewhere = centre.command(other_node, node="node-002", seq=1).model_copy(
        update={"subject": NODE}
    )
    expired = centre.command(action, seq=1, ttl_s=10)
    outcomes = [
        executor.handle(elsewhere, now),
        executor.handle(expired, now + timedelta(seconds=60)),
    ]
    assert [(r.outcome, r.reason) for r in outcomes if r] == [
        ("rejected", "wrong_audience"), ("rejected", "expired")
    ]
    assert journal.interval_s is None
    # Executed once; the same command again is a duplicate with the cached answer.
    command = centre.command(action, seq=5, epoch=3)
    first = executor.handle(command, now)
    again = executor.handle(command, now)
    assert first is not None
    assert again is not None
    assert first.outcome == "succeeded"
    assert again.duplicate
    assert again.outputs == first.outputs
    # Idempotent and disrupting nothing, they sit outside seq and epoch: an old seq or
    # epoch is no reason to refuse them, and they never move the node's ordering.
    old_seq = executor.handle(centre.command(action, seq=5, epoch=3), now)
    old_epoch = executor.handle(centre.command(action, seq=6, epoch=2), now)
    assert old_seq is not None
    assert old_epoch is not None
    assert (old_seq.outcome, old_epoch.outcome) == ("succeeded", "succeeded")
    assert journal.last_seq is None
    assert journal.max_epoch is None
    # A disruptive command still meets the ordering afterwards.
    drain = executor.handle(centre.command(DrainNode(node_id=NODE), seq=1, epoch=1), now)
    assert drain is not None
    assert drain.outcome == "succeeded"
    assert journal.command_count() == 6  # every answer but the duplicate's


def test_dry_run_interval_changes_nothing(
    executor: CommandExecutor, centre: Any, journal: Journal, now: datetime
) -> None:
    result = executor.handle(
        centre.command(SetReportInterval(node_id=NODE, interval_s=60.0), dry_run=True), now
    )
    assert result is not None
    assert result.outcome == "succeeded"
    assert result.outputs == {
        "dry_run": True, "mode": "active", "interval_s": 2.0, "target_interval_s": 60.0
    }
    assert journal.interval_s is None
    assert executor.interval_s == 2.0


@pytest.mark.parametrize(
    "action",
    [ProbeNode(node_id=NODE), SetReportInterval(node_id=NODE, interval_s=10.0)],
    ids=lambda action: action.action,
)
def test_injected_failure_of_the_new_actions(
    executor: CommandExecutor, centre: Any, journal: Journal, state_dir: Path, now: datetime,
    action: Any,
) -> None:
    write_faults(state_dir, FaultPlan(fail_actions=[action.action]))
    result = executor.handle(centre.command(action), now)
    assert result is not None
    assert (result.outcome, result.reason) == ("failed", "injected_failure")
    assert journal.interval_s is None
