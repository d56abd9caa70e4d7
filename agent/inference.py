"""The run_inference action: one ML task on one of the node's models.

Deciding checks what can be checked without side effects (the node takes work, the model is
here and ready, the input is valid): a refusal is answered at once with its cause. Running
takes one of the model's concurrency slots, predicts and checks the output; with a slow
model in the fault plan it runs in the background (a long action) and answers when done, or
gives up with `timeout` after the action's `timeout_s`.

`InferenceJournal` keeps the answers apart from the command journal, for the executor to
journal them in: a replayed run_inference is answered from it (never run twice, the same
result), query_status reads it, and it is pruned to a retention and a size, with no fsync per
answer (why that is enough is argued there).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from functools import partial
from pathlib import Path
from uuid import UUID, uuid4

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.effects import IN_PROGRESS, Effect
from agent.faults import FaultPlan
from agent.journal import immediate_transaction
from agent.ml.serving import Answer, ModelServer, check_input, fault_for
from schemas.envelope import short_text
from schemas.events.v1 import CommandResult, InferenceOutput, NodeMode, RunInference

log = logging.getLogger("clusterwarden.agent.inference")

INFERENCE_JOURNAL_FILE = "inferences.sqlite3"


def _output(action: RunInference, answer: Answer) -> InferenceOutput:
    return InferenceOutput(
        task_id=action.task_id, attempt=action.attempt, task_type=action.task_type,
        model=action.model, version=action.version, family=answer.family,
        cause=answer.cause, latency_ms=min(answer.latency_ms, 3_600_000.0),
        prediction=answer.prediction, confidence=answer.confidence,
        detail=short_text(answer.detail))


def answer_effect(action: RunInference, answer: Answer) -> Effect:
    """The command's effect for an answer: succeeded with a prediction, or failed with a cause.

    The cause is also the result's reason, so `warden events` and the journal show it.
    """
    if answer.cause is None:
        return Effect("succeeded", inference=_output(action, answer))
    return Effect("failed", answer.cause, inference=_output(action, answer))


class InferenceActions:
    """Decides and runs run_inference on one node's model server; `journal` keeps the answers
    (the executor journals them there, and answers replays and queries from it)."""

    def __init__(self, models: ModelServer | None,
                 fault_plan: Callable[[], FaultPlan] = FaultPlan,
                 journal: InferenceJournal | None = None) -> None:
        self.models = models
        self.fault_plan = fault_plan
        self.journal = journal

    def cached_result(self, command_id: UUID) -> CommandResult | None:
        """The answer journaled for `command_id` (None without a journal)."""
        return None if self.journal is None else self.journal.cached_result(command_id)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    def decide(self, action: RunInference, mode: NodeMode, command_id: UUID) -> Effect:
        """The refusal now, or the effect that runs the task (nothing is changed yet)."""
        if mode != "active":
            return answer_effect(action, Answer("unavailable", 0.0,
                                                detail=f"the node is {mode}"))
        models = self.models
        loaded = models.find(action.model, action.version) if models is not None else None
        if models is None or loaded is None or loaded.spec.task_type != action.task_type:
            return answer_effect(action, Answer(
                "unavailable", 0.0,
                detail=f"{action.model}@{action.version} is not served here for "
                       f"{action.task_type}"))
        if loaded.state != "ready":
            return answer_effect(action, Answer("unavailable", 0.0, family=loaded.spec.family,
                                                detail=f"the model is {loaded.state}"))
        why = check_input(action.task_type, action.input)
        if why is not None:
            return answer_effect(action, Answer("bad_input", 0.0, family=loaded.spec.family,
                                                detail=why))
        fault = fault_for(self.fault_plan().model_faults, loaded.spec)
        plan = f"predict with {loaded.spec.key}"
        if fault is not None and fault.latency_ms > 0.0:
            return Effect("succeeded", run=partial(self._run_slow, action, models, command_id,
                                                   fault.latency_ms / 1000.0), plan=plan)
        return Effect("succeeded", apply=partial(self._run, action, models, command_id),
                      plan=plan)

    def _run(self, action: RunInference, models: ModelServer, command_id: UUID) -> Effect:
        loaded, refusal = models.admit(action.task_type, action.model, action.version,
                                       action.input)
        if loaded is None:
            return answer_effect(action, refusal or Answer("unavailable", 0.0))
        try:
            fault = fault_for(self.fault_plan().model_faults, loaded.spec)
            return answer_effect(action, models.run(loaded, action.input, fault, command_id))
        finally:
            models.release(loaded)

    async def _run_slow(self, action: RunInference, models: ModelServer, command_id: UUID,
                        delay_s: float) -> Effect:
        started = time.monotonic()
        loaded, refusal = models.admit(action.task_type, action.model, action.version,
                                       action.input)
        if loaded is None:
            return answer_effect(action, refusal or Answer("unavailable", 0.0))
        try:
            if delay_s >= action.timeout_s:
                await asyncio.sleep(action.timeout_s)
                return answer_effect(action, Answer(
                    "timeout", (time.monotonic() - started) * 1000.0,
                    family=loaded.spec.family,
                    detail=f"no answer within {action.timeout_s:g} s"))
            await asyncio.sleep(delay_s)
            fault = fault_for(self.fault_plan().model_faults, loaded.spec)
            answer = models.run(loaded, action.input, fault, command_id)
            return answer_effect(action, Answer(
                answer.cause, (time.monotonic() - started) * 1000.0, answer.prediction,
                answer.confidence, answer.detail, answer.family))
        finally:
            models.release(loaded)


# ---------------------------------------------------------------- the inference journal


def replay_window_s(max_ttl_s: float, leeway_s: float) -> float:
    """How long after a command was first accepted a replay of it may still be accepted.

    The agent accepts a command from `issued_at - leeway` to `expires_at + leeway`
    (agent.commands.check_window) and refuses one whose `expires_at - issued_at` exceeds
    `max_ttl`: from the first acceptance to the last possible one is at most
    `max_ttl + 2 * leeway`. A replay is answered from the journal while its answer is kept
    (`duplicate`, however late); once the answer is gone, the window check refuses the
    replay as expired, so an answer kept that long is all idempotency needs.
    """
    return max_ttl_s + 2.0 * leeway_s


class InferenceJournalSettings(BaseSettings):
    """How long answers are kept (env prefix `AGENT_INFERENCE_`)."""

    model_config = SettingsConfigDict(env_prefix="AGENT_INFERENCE_", extra="ignore",
                                      frozen=True)

    retention_s: float = Field(
        default=3_600.0, gt=0.0, le=7 * 86_400.0,
        description="Answers older than this are pruned (never sooner than a replay of their "
                    "command could still be accepted: max_command_ttl_s + 2 command_leeway_s).")
    max_entries: int = Field(
        default=50_000, ge=1, le=10_000_000,
        description="At most this many answers are kept, the oldest pruned first (again, "
                    "never one a replay could still ask for).")
    prune_every: int = Field(
        default=1_000, ge=1, le=1_000_000,
        description="Answers journaled between two prunes (and a prune a minute at least).")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS inferences (
    command_id  TEXT PRIMARY KEY,
    outcome     TEXT NOT NULL,
    reason      TEXT NOT NULL,
    result_json TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS inferences_by_age ON inferences (recorded_at);
"""
# An answer still running (a slow model's) is never pruned: it is finished, or failed as
# interrupted when the agent restarts, and prunable from then on.
_PRUNABLE = f"NOT (outcome = 'unknown' AND reason = '{IN_PROGRESS}')"


class InferenceJournal:
    """The answers to run_inference commands, kept as long as a replay may ask for them.

    What it must do: a replayed run_inference command (Kafka redelivers after a rebalance or
    an agent restart) is not run again and gets the same answer; a query_status of the
    attempt reads the answer. Both only matter while the command can still be accepted
    (`replay_window_s`, six minutes by default) and while the router waits for the attempt
    (`ROUTER_ATTEMPT_TIMEOUT_S`, 3 s by default: later it has timed the attempt out, and
    ignores its answer). So answers are pruned
    by age (`retention_s`, an hour by default) and by number (`max_entries`), but never
    inside the replay window: idempotency wins over the size bound (a node answering more
    than `max_entries` tasks in six minutes keeps what those six minutes need, with a
    warning).

    Why no fsync per answer (SQLite WAL with synchronous=NORMAL: a commit is a write into
    the WAL, synced only at checkpoints), unlike the command journal's synchronous=FULL:
    that journal guards what must never be lost (the fencing epoch and sequence a stale
    executor is refused by, the node's mode, a migration that must not run twice). An
    inference changes nothing on the node, and its answer is a function of the model
    version, the input and the command id (the models are trained deterministically, and
    the fault draw is seeded by the command id), so running it again gives the same answer.
    A crash of the agent process loses nothing (committed writes are in the operating
    system's cache); only a crash of the machine can lose the last answers, and then: a
    redelivered command runs the inference once more, with the same answer, and the router
    takes the first answer of an attempt only (it ends the attempt by command id); a
    query_status answers `not_in_journal`, and the attempt, which the router times out
    anyway, is retried within its budget - what happens to any answer lost on the way. An
    fsync per answer (about 3 ms here against 0.1 ms without, more than the inference
    itself) would buy nothing.
    """

    def __init__(self, path: Path, *, retention_s: float = 3_600.0,
                 max_entries: int = 50_000, keep_at_least_s: float = 0.0,
                 prune_every: int = 1_000, prune_interval_s: float = 60.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if retention_s < keep_at_least_s:
            log.warning("inference retention %.0f s is shorter than a replay may come "
                        "(%.0f s): answers are kept %.0f s", retention_s, keep_at_least_s,
                        keep_at_least_s)
        self.path = path
        self.retention_s = max(retention_s, keep_at_least_s)
        self.keep_at_least_s = keep_at_least_s
        self.max_entries = max_entries
        self.prune_every = prune_every
        self.prune_interval_s = prune_interval_s
        self._since_prune = 0
        self._pruned_at: float | None = None
        self._over_cap_warned = False
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL (in WAL mode): no fsync per commit; see the class docstring for why.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def open(cls, state_dir: Path, *, keep_at_least_s: float = 0.0,
             settings: InferenceJournalSettings | None = None) -> InferenceJournal:
        """The inference journal in an agent's state directory (next to the command journal);
        `keep_at_least_s` is the replay window (`replay_window_s`)."""
        settings = settings or InferenceJournalSettings()
        return cls(state_dir / INFERENCE_JOURNAL_FILE, retention_s=settings.retention_s,
                   max_entries=settings.max_entries, keep_at_least_s=keep_at_least_s,
                   prune_every=settings.prune_every)

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ reads

    def cached_result(self, command_id: UUID) -> CommandResult | None:
        """The answer journaled for `command_id`, if it is still kept."""
        row = self._db.execute("SELECT result_json FROM inferences WHERE command_id = ?",
                               (str(command_id),)).fetchone()
        return None if row is None else CommandResult.model_validate_json(row[0])

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM inferences").fetchone()[0])

    def in_progress(self) -> list[UUID]:
        """The slow inferences journaled as accepted and not finished."""
        rows = self._db.execute(
            "SELECT command_id FROM inferences WHERE outcome = 'unknown' AND reason = ?",
            (IN_PROGRESS,)).fetchall()
        return [UUID(row[0]) for row in rows]

    # ------------------------------------------------------------ writes

    def record(self, result: CommandResult, *, seq: int | None = None,
               epoch: int | None = None, accepted: bool = True,
               mode: NodeMode | None = None, interval_s: float | None = None,
               fence: str = "node", now: datetime) -> bool:
        """Journal an answer; False if its command was journaled already (the first counts).

        The signature is the command journal's (agent.journal.Journal.record), so that the
        executor journals either the same way; an answer here never advances the command
        order nor changes the node (run_inference is outside both), hence `seq`, `epoch`,
        `mode` and `interval_s` must be None, and `accepted` and `fence` mean nothing.
        """
        del accepted, fence
        if (seq, epoch, mode, interval_s) != (None, None, None, None):
            raise ValueError("the inference journal keeps answers outside the command order "
                             "that change nothing on the node")
        with self._transaction():
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO inferences"
                " (command_id, outcome, reason, result_json, recorded_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (str(result.command_id), result.outcome, result.reason,
                 result.model_dump_json(), now.timestamp())).rowcount
        if inserted:
            self._since_prune += 1
            self._maybe_prune(now)
        return bool(inserted)

    def complete(self, result: CommandResult) -> bool:
        """Replace a slow inference's in-progress mark by its answer; False if it had none."""
        with self._transaction():
            updated = self._db.execute(
                "UPDATE inferences SET outcome = ?, reason = ?, result_json = ?"
                " WHERE command_id = ? AND outcome = 'unknown' AND reason = ?",
                (result.outcome, result.reason, result.model_dump_json(),
                 str(result.command_id), IN_PROGRESS)).rowcount
        return bool(updated)

    def interrupt_in_progress(self, now: datetime, reason: str = "interrupted") -> list[UUID]:
        """Fail every slow inference left in progress (by an agent that stopped or died)."""
        interrupted = []
        with self._transaction():
            rows = self._db.execute(
                "SELECT result_json FROM inferences WHERE outcome = 'unknown' AND reason = ?",
                (IN_PROGRESS,)).fetchall()
            for (body,) in rows:
                failed = CommandResult.model_validate_json(body).model_copy(update={
                    "event_id": uuid4(), "occurred_at": now, "outcome": "failed",
                    "reason": reason})
                self._db.execute(
                    "UPDATE inferences SET outcome = ?, reason = ?, result_json = ?"
                    " WHERE command_id = ?",
                    (failed.outcome, failed.reason, failed.model_dump_json(),
                     str(failed.command_id)))
                interrupted.append(failed.command_id)
        return interrupted

    def prune(self, now: datetime) -> int:
        """Drop answers past the retention, then the oldest beyond `max_entries` (never one
        inside the replay window, nor one in progress); how many were dropped."""
        at = now.timestamp()
        with self._transaction():
            dropped = self._db.execute(
                f"DELETE FROM inferences WHERE recorded_at < ? AND {_PRUNABLE}",
                (at - self.retention_s,)).rowcount
            excess = self.count() - self.max_entries
            if excess > 0:
                dropped += self._db.execute(
                    "DELETE FROM inferences WHERE command_id IN (SELECT command_id FROM"
                    f" inferences WHERE recorded_at < ? AND {_PRUNABLE}"
                    " ORDER BY recorded_at LIMIT ?)",
                    (at - self.keep_at_least_s, excess)).rowcount
        self._since_prune, self._pruned_at = 0, at
        kept = self.count()
        if kept > self.max_entries and not self._over_cap_warned:
            self._over_cap_warned = True
            log.warning("%d inference answers are inside the replay window (%.0f s), above "
                        "AGENT_INFERENCE_MAX_ENTRIES=%d: all are kept", kept,
                        self.keep_at_least_s, self.max_entries)
        return dropped

    def _maybe_prune(self, now: datetime) -> None:
        # Amortised: one indexed DELETE every `prune_every` answers (or a minute), so the
        # journal holds at most max(max_entries, the replay window's) + prune_every answers.
        due = self._pruned_at is None or now.timestamp() - self._pruned_at >= \
            self.prune_interval_s
        if self._since_prune >= self.prune_every or due:
            dropped = self.prune(now)
            if dropped:
                log.debug("pruned %d inference answers", dropped)

    def _transaction(self) -> AbstractContextManager[None]:
        return immediate_transaction(self._db)
