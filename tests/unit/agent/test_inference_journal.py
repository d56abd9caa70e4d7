"""The inference journal: bounded by age and number, never inside the replay window, and a
replayed run_inference still answered once, with the same answer."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.commands import CommandExecutor, check_window
from agent.effects import IN_PROGRESS, Outcome
from agent.faults import ModelFault
from agent.inference import (
    INFERENCE_JOURNAL_FILE,
    InferenceActions,
    InferenceJournal,
    InferenceJournalSettings,
    replay_window_s,
)
from agent.journal import Journal
from agent.ml.serving import Answer, Loaded, ModelServer
from schemas.events.v1 import (
    CommandPayload,
    CommandResult,
    InferenceOutput,
    QueryStatus,
    RunInference,
)
from tests.unit.agent.conftest import CLUSTER, NODE, NOW, Centre

LEEWAY_S, MAX_TTL_S = 30.0, 300.0
WINDOW_S = replay_window_s(MAX_TTL_S, LEEWAY_S)


def answer_for(command_id: UUID, at: datetime, prediction: int = 7,
               outcome: Outcome = "succeeded", reason: str = "") -> CommandResult:
    """A run_inference answer as the executor journals it."""
    task_id = uuid4()
    return CommandResult(
        event_id=uuid4(), source=f"agent-{NODE}", occurred_at=at, cluster_id=CLUSTER,
        subject=NODE, command_id=command_id, node_id=NODE, task_id=task_id, step_index=0,
        action="run_inference", outcome=outcome, reason=reason,
        inference=InferenceOutput(task_id=task_id, attempt=1, task_type="digits",
                                  model="digits-knn", version="1", family="knn",
                                  latency_ms=1.0, prediction=prediction, confidence=0.9))


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "agents" / NODE / INFERENCE_JOURNAL_FILE


@pytest.fixture
def small(journal_path: Path) -> Iterator[InferenceJournal]:
    """Kept 100 s (replays come for 60 s), at most 200 answers, pruned every 10."""
    journal = InferenceJournal(journal_path, retention_s=100.0, max_entries=200,
                               keep_at_least_s=60.0, prune_every=10)
    yield journal
    journal.close()


def feed(journal: InferenceJournal, start: datetime, per_s: float,
         seconds: float) -> tuple[list[UUID], list[int]]:
    """Answers at `per_s` a second for `seconds`; the ids and the count after each."""
    ids, counts = [], []
    for i in range(int(per_s * seconds)):
        command_id = uuid4()
        assert journal.record(answer_for(command_id, start),
                              now=start + timedelta(seconds=i / per_s))
        ids.append(command_id)
        counts.append(journal.count())
    return ids, counts


def test_pruning_bounds_the_journal_by_age(small: InferenceJournal) -> None:
    # One answer a second for 20 minutes: never more than the last 100 s (and a prune's
    # worth of slack) are kept.
    ids, counts = feed(small, NOW, per_s=1.0, seconds=1_200)
    assert max(counts) <= 100 + small.prune_every
    assert counts[-1] >= 100
    # The newest answers are all there, the old ones gone.
    assert all(small.cached_result(c) is not None for c in ids[-100:])
    assert all(small.cached_result(c) is None for c in ids[:1_000])


def test_pruning_bounds_the_journal_by_number_and_its_file_stops_growing(
        small: InferenceJournal, journal_path: Path) -> None:
    # Three answers a second: the retention alone would keep 300, the number caps it at 200
    # (the 60 s a replay may come in hold 180 of them, under the cap).
    ids, counts = feed(small, NOW, per_s=3.0, seconds=600)
    assert max(counts) <= small.max_entries + small.prune_every
    pages = _pages(journal_path)
    ids_more, counts_more = feed(small, NOW + timedelta(seconds=600), per_s=3.0, seconds=1_200)
    assert max(counts_more) <= small.max_entries + small.prune_every
    # Freed pages are reused: three times as many answers, the same file.
    assert _pages(journal_path) <= pages * 1.2 + 4
    assert all(small.cached_result(c) is not None for c in ids_more[-small.max_entries:])
    assert small.cached_result(ids[0]) is None


def _pages(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA page_count").fetchone()[0])


def test_answers_a_replay_may_still_ask_for_are_never_pruned(journal_path: Path) -> None:
    journal = InferenceJournal(journal_path, retention_s=300.0, max_entries=5,
                               keep_at_least_s=60.0, prune_every=1)
    try:
        ids, counts = feed(journal, NOW, per_s=2.0, seconds=25)
        # Over the number cap, but every one could still be replayed: all are kept.
        assert counts[-1] == 50
        assert all(journal.cached_result(c) is not None for c in ids)
        # Those outside the window go first, oldest first, while over the cap...
        journal.prune(NOW + timedelta(seconds=70))
        assert journal.count() == 30
        assert all(journal.cached_result(c) is not None for c in ids[20:])
        # ...and once all are outside it, the cap holds: the newest five are kept.
        journal.prune(NOW + timedelta(seconds=90))
        assert [journal.cached_result(c) is not None for c in ids] == [False] * 45 + [True] * 5
    finally:
        journal.close()
    # A retention shorter than the replay window is raised to it.
    short = InferenceJournal(journal_path, retention_s=10.0, keep_at_least_s=60.0)
    try:
        assert short.retention_s == 60.0
    finally:
        short.close()


def test_a_slow_inference_in_progress_is_kept_until_it_ends(small: InferenceJournal) -> None:
    running, finished = uuid4(), uuid4()
    small.record(answer_for(running, NOW, outcome="unknown", reason=IN_PROGRESS), now=NOW)
    small.record(answer_for(finished, NOW), now=NOW)
    small.prune(NOW + timedelta(hours=2))
    assert small.in_progress() == [running]
    assert small.cached_result(finished) is None
    # The agent restarts: what was in progress ends as interrupted, and is prunable then.
    assert small.interrupt_in_progress(NOW + timedelta(hours=2)) == [running]
    interrupted = small.cached_result(running)
    assert interrupted is not None
    assert (interrupted.outcome, interrupted.reason) == ("failed", "interrupted")
    assert not small.complete(answer_for(running, NOW))  # the first ending counts
    small.prune(NOW + timedelta(hours=4))
    assert small.count() == 0


def test_a_replayed_answer_is_the_first_one_within_the_retention(
        small: InferenceJournal) -> None:
    command_id = uuid4()
    first = answer_for(command_id, NOW, prediction=3)
    assert small.record(first, now=NOW)
    # Later answers (and their prunes) come and go; the replay still finds the first answer.
    feed(small, NOW, per_s=1.0, seconds=59)
    assert not small.record(answer_for(command_id, NOW, prediction=5),
                            now=NOW + timedelta(seconds=59))
    assert small.cached_result(command_id) == first


def test_only_answers_outside_the_command_order_are_kept(small: InferenceJournal) -> None:
    with pytest.raises(ValueError, match="outside the command order"):
        small.record(answer_for(uuid4(), NOW), seq=3, epoch=1, now=NOW)
    with pytest.raises(ValueError, match="change nothing"):
        small.record(answer_for(uuid4(), NOW), mode="draining", now=NOW)


def test_no_fsync_per_answer(small: InferenceJournal, journal_path: Path) -> None:
    """WAL with synchronous=NORMAL: a commit is a write, synced at checkpoints only."""
    db = small._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL (FULL is 2)
    # A process that dies without closing loses nothing committed.
    command_id = uuid4()
    small.record(answer_for(command_id, NOW), now=NOW)
    again = InferenceJournal(journal_path, keep_at_least_s=60.0)
    try:
        assert again.cached_result(command_id) is not None
    finally:
        again.close()


def test_the_settings_and_the_replay_window(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    assert WINDOW_S == 360.0
    defaults = InferenceJournalSettings()
    assert (defaults.retention_s, defaults.max_entries) == (3_600.0, 50_000)
    monkeypatch.setenv("AGENT_INFERENCE_RETENTION_S", "600")
    monkeypatch.setenv("AGENT_INFERENCE_MAX_ENTRIES", "1000")
    journal = InferenceJournal.open(tmp_path, keep_at_least_s=WINDOW_S)
    try:
        assert (journal.retention_s, journal.max_entries) == (600.0, 1_000)
        assert journal.path == tmp_path / INFERENCE_JOURNAL_FILE
    finally:
        journal.close()


@settings(max_examples=200, deadline=None)
@given(issued=st.floats(-400.0, 400.0), ttl=st.floats(0.001, MAX_TTL_S),
       accepted=st.floats(-400.0, 800.0), later=st.floats(0.0, 3_600.0))
def test_a_replay_after_the_window_is_refused_once_its_answer_is_gone(
        issued: float, ttl: float, accepted: float, later: float) -> None:
    """Keeping an answer `replay_window_s` after its command was accepted is enough: any
    replay later than that, its answer gone from the journal, is refused as expired by the
    window check."""
    issued_at = NOW + timedelta(seconds=issued)
    payload = CommandPayload(
        command_id=uuid4(), cluster_id="local", node_id=NODE, seq=0, epoch=1,
        issued_at=issued_at,
        expires_at=issued_at + timedelta(seconds=ttl), task_id=uuid4(), step_index=0,
        action=RunInference(node_id=NODE, task_id=uuid4(), attempt=1, task_type="digits",
                            model="digits-knn", version="1", input=[0.0] * 64))
    first = NOW + timedelta(seconds=accepted)
    if check_window(payload, first, LEEWAY_S, MAX_TTL_S) is not None:
        return  # never accepted: nothing journaled
    replay = first + timedelta(seconds=WINDOW_S + 0.001 + later)
    assert check_window(payload, replay, LEEWAY_S, MAX_TTL_S) == "expired"


# ---------------------------------------------------------------- through the executor


class CountingServer(ModelServer):
    """The node's models, counting the predictions actually made."""

    runs: int = 0

    def run(self, loaded: Loaded, values: Sequence[float], fault: ModelFault | None,
            command_id: UUID) -> Answer:
        self.runs += 1
        return super().run(loaded, values, fault, command_id)


@pytest.fixture(scope="module")
def knn() -> CountingServer:
    server = CountingServer(("digits-knn@1",))
    server.load()
    return server


def test_a_replayed_run_inference_runs_once_and_gets_the_same_answer(
        centre: Centre, journal: Journal, knn: CountingServer) -> None:
    executor = CommandExecutor(NODE, CLUSTER, centre.verifier, journal, leeway_s=LEEWAY_S,
                               max_ttl_s=MAX_TTL_S, models=knn)
    action = RunInference(node_id=NODE, task_id=uuid4(), attempt=1, task_type="digits",
                          model="digits-knn", version="1", input=[4.0] * 64)
    command = centre.command(action, seq=0, ttl_s=10.0)
    before = knn.runs
    first = executor.handle(command, NOW)
    # Redelivered within its validity: answered from the journal, not run again.
    replayed = executor.handle(command, NOW + timedelta(seconds=10 + LEEWAY_S - 1))
    assert first is not None
    assert replayed is not None
    assert knn.runs == before + 1
    assert replayed.duplicate
    assert (replayed.outcome, replayed.inference) == (first.outcome, first.inference)
    # Past its validity it is still the answer it got (a duplicate, not `expired`), while
    # the journal keeps it; not run either.
    late = executor.handle(command, NOW + timedelta(seconds=10 + LEEWAY_S + 1))
    assert late is not None
    assert (late.outcome, late.duplicate, late.inference) == (
        first.outcome, True, first.inference)
    assert knn.runs == before + 1


def test_the_actions_answer_from_their_journal(journal_path: Path,
                                               knn: CountingServer) -> None:
    journal = InferenceJournal(journal_path, keep_at_least_s=WINDOW_S)
    actions = InferenceActions(knn, journal=journal)
    try:
        command_id = uuid4()
        assert actions.cached_result(command_id) is None
        journal.record(answer_for(command_id, NOW), now=NOW)
        assert actions.cached_result(command_id) == journal.cached_result(command_id)
        assert InferenceActions(knn).cached_result(command_id) is None  # no journal
    finally:
        actions.close()


def test_the_executor_journals_answers_apart_from_commands(
        centre: Centre, journal: Journal, knn: CountingServer) -> None:
    executor = CommandExecutor(NODE, CLUSTER, centre.verifier, journal, leeway_s=LEEWAY_S,
                               max_ttl_s=MAX_TTL_S, models=knn)
    try:
        inferences = executor.inference.journal
        assert inferences is not None
        assert inferences.path == journal.path.parent / INFERENCE_JOURNAL_FILE
        assert inferences.keep_at_least_s == WINDOW_S
        action = RunInference(node_id=NODE, task_id=uuid4(), attempt=1, task_type="digits",
                              model="digits-knn", version="1", input=[4.0] * 64)
        command = centre.command(action, seq=0)
        result = executor.handle(command, NOW)
        assert result is not None
        command_id = result.command_id
        # The answer is in the inference journal only: the command journal is not written.
        assert inferences.cached_result(command_id) == result
        assert journal.cached_result(command_id) is None
        assert journal.command_count() == 0
        # query_status reads it there.
        status = QueryStatus(node_id=NODE, command_id=command_id)
        query = executor.handle(centre.command(status, seq=0), NOW)
        assert query is not None
        assert (query.outcome, query.outputs["queried_action"]) == (
            "succeeded", "run_inference")
    finally:
        executor.close()
