"""The command journal keeps replay protection, mode and report seq across restarts."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import datetime
from pathlib import Path
from uuid import uuid4

import pytest

from agent.journal import JOURNAL_FILE, Journal
from schemas.events.v1 import CommandResult


def result(outcome: str = "succeeded", **outputs: str | bool) -> CommandResult:
    return CommandResult.model_validate(
        {
            "event_id": uuid4(),
            "source": "agent-node-001",
            "occurred_at": datetime.fromisoformat("2026-03-01T12:00:00+00:00"),
            "cluster_id": "local",
            "subject": "node-001",
            "command_id": uuid4(),
            "node_id": "node-001",
            "action": "drain_node",
            "outcome": outcome,
            "outputs": outputs,
        }
    )


def test_state_survives_reopen(state_dir: Path, now: datetime) -> None:
    journal = Journal.open(state_dir)
    assert (journal.last_seq, journal.max_epoch, journal.mode) == (None, None, "active")
    drained = result(mode="draining")
    assert journal.record(drained, seq=7, epoch=3, accepted=True, mode="draining", now=now)
    journal.close()

    reopened = Journal.open(state_dir)
    try:
        assert reopened.last_seq == 7
        assert reopened.max_epoch == 3
        assert reopened.mode == "draining"
        assert reopened.cached_result(drained.command_id) == drained
        assert reopened.cached_result(uuid4()) is None
    finally:
        reopened.close()


def test_first_result_wins(journal: Journal, now: datetime) -> None:
    executed = result("succeeded")
    assert journal.record(executed, seq=1, epoch=1, accepted=True, mode="draining", now=now)
    rejected = executed.model_copy(update={"outcome": "rejected", "reason": "expired"})
    assert not journal.record(rejected, seq=9, epoch=9, accepted=True, mode="offline", now=now)
    assert journal.cached_result(executed.command_id) == executed
    # The ignored record changed nothing else either.
    assert (journal.last_seq, journal.max_epoch, journal.mode) == (1, 1, "draining")


def test_rejections_do_not_advance_seq_or_epoch(journal: Journal, now: datetime) -> None:
    journal.record(result(), seq=5, epoch=2, accepted=True, now=now)
    journal.record(result("rejected"), seq=50, epoch=20, accepted=False, now=now)
    journal.record(result("rejected"), seq=None, epoch=None, accepted=False, now=now)
    assert (journal.last_seq, journal.max_epoch) == (5, 2)
    assert journal.command_count() == 3


def test_seq_and_epoch_never_go_down(journal: Journal, now: datetime) -> None:
    journal.record(result(), seq=10, epoch=4, accepted=True, now=now)
    journal.record(result(), seq=3, epoch=1, accepted=True, now=now)
    assert (journal.last_seq, journal.max_epoch) == (10, 4)


def test_report_seq_keeps_rising(state_dir: Path) -> None:
    journal = Journal.open(state_dir)
    assert journal.next_report_seq(1_000) == 1_000
    # The clock stepped back: seq still rises.
    assert journal.next_report_seq(500) == 1_001
    journal.close()
    reopened = Journal.open(state_dir)
    try:
        assert reopened.next_report_seq(0) == 1_002
        assert reopened.next_report_seq(5_000) == 5_000
    finally:
        reopened.close()


def test_durability_settings(journal: Journal, state_dir: Path) -> None:
    with closing(sqlite3.connect(state_dir / JOURNAL_FILE)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_failed_write_rolls_back(journal: Journal, now: datetime) -> None:
    journal.record(result(), seq=1, epoch=1, accepted=True, mode="draining", now=now)
    with pytest.raises(sqlite3.IntegrityError):
        # The mode CHECK constraint fails after the insert: nothing of it may remain.
        journal.record(result(), seq=2, epoch=2, accepted=True, mode="broken", now=now)  # type: ignore[arg-type]
    assert (journal.last_seq, journal.mode, journal.command_count()) == (1, "draining", 1)


def test_interval_survives_reopen(state_dir: Path, now: datetime) -> None:
    journal = Journal.open(state_dir)
    assert journal.interval_s is None  # never set: the agent uses its configured interval
    changed = result(interval_s="0.75")
    assert journal.record(changed, seq=1, epoch=1, accepted=True, interval_s=0.75, now=now)
    journal.close()
    reopened = Journal.open(state_dir)
    try:
        assert reopened.interval_s == 0.75
        assert reopened.mode == "active"  # the interval is not a mode change
        reopened.set_interval(3_600.0)
        assert reopened.interval_s == 3_600.0
    finally:
        reopened.close()


def test_interval_is_not_changed_by_a_rejected_duplicate(state_dir: Path, now: datetime) -> None:
    journal = Journal.open(state_dir)
    try:
        first = result()
        journal.record(first, seq=1, epoch=1, accepted=True, interval_s=5.0, now=now)
        # The same command id again (a replay) must change nothing, interval included.
        assert not journal.record(first, seq=2, epoch=1, accepted=True, interval_s=1.0, now=now)
        assert journal.interval_s == 5.0
    finally:
        journal.close()


def test_a_long_action_is_completed_once(journal: Journal, now: datetime) -> None:
    pending = result("unknown").model_copy(update={"reason": "in_progress"})
    assert journal.record(pending, seq=4, epoch=1, accepted=True, now=now)
    assert journal.last_seq == 4  # accepted when it starts: a replay is a duplicate
    assert journal.in_progress() == [pending.command_id]

    done = pending.model_copy(update={"outcome": "succeeded", "reason": ""})
    assert journal.complete(done)
    assert journal.cached_result(pending.command_id) == done
    # A late second ending (a cancel racing the end) never overwrites the first.
    late = pending.model_copy(update={"outcome": "failed", "reason": "cancelled"})
    assert not journal.complete(late)
    assert journal.cached_result(pending.command_id) == done
    assert not journal.complete(result())  # never journaled at all
    assert journal.in_progress() == []


def test_a_restart_fails_what_was_left_in_progress(state_dir: Path, now: datetime) -> None:
    journal = Journal.open(state_dir)
    pending = result("unknown", job_id="j1").model_copy(update={"reason": "in_progress"})
    finished = result("succeeded")
    journal.record(pending, seq=1, epoch=1, accepted=True, now=now)
    journal.record(finished, seq=2, epoch=1, accepted=True, now=now)
    journal.close()

    reopened = Journal.open(state_dir)
    try:
        assert reopened.interrupt_in_progress(now) == [pending.command_id]
        interrupted = reopened.cached_result(pending.command_id)
        assert interrupted is not None
        assert (interrupted.outcome, interrupted.reason, interrupted.outputs) == (
            "failed", "interrupted", {"job_id": "j1"}
        )
        assert reopened.cached_result(finished.command_id) == finished
        assert reopened.interrupt_in_progress(now) == []
    finally:
        reopened.close()


def test_report_seq_is_held_within_the_clock_skew_the_collector_allows(
        state_dir: Path) -> None:
    # The clock ran an hour ahead, then was set right: seq keeps rising from the clock's
    # limit (now + 30 s), which the collector accepts, not from the stored value an hour on.
    journal = Journal.open(state_dir)
    try:
        hour_ahead = 3_600_000 + 10_000
        assert journal.next_report_seq(hour_ahead) == hour_ahead
        assert journal.next_report_seq(10_000) == 10_000 + 30_000
        assert journal.next_report_seq(20_000) == 10_000 + 30_000 + 1
        assert journal.next_report_seq(60_000) == 60_000
    finally:
        journal.close()
