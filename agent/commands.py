"""Verifying and executing signed commands, in the order docs/reliability.md
§Command verification sets.

Every check runs before any side effect. A command that fails its key, algorithm or
signature check raises PermanentError (it is dead-lettered: nobody trustworthy is waiting
for an answer); every other rejection is answered with a `rejected` result and journaled.

Most actions finish at once and `handle` returns their result. A long action (migrate_job,
stop_job, set_resources with a restart) is journaled as in progress and runs as an asyncio
task; its result is journaled and handed to `publish` when it ends. Until then query_status
answers it ("unknown", "in_progress"), a duplicate of it gets no answer (the real one
follows), and `cancel` may stop it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from uuid import UUID, uuid4

from pydantic import ValidationError

from agent.actions import JOB_ACTIONS, JobActions
from agent.effects import IN_PROGRESS, Effect, Outcome
from agent.faults import FaultPlan
from agent.inference import InferenceActions, InferenceJournal, replay_window_s
from agent.journal import NODE_FENCE, Journal
from agent.ml.serving import ModelServer
from common.clock import Clock
from common.errors import describe_validation_error
from common.signing import CommandVerifier, unb64url
from schemas.envelope import IDENTIFIER_MAX, short_text
from schemas.events.v1 import (
    Action,
    ActionName,
    Cancel,
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    InferenceOutput,
    MigrateJob,
    NodeMode,
    OfflineNode,
    OnlineNode,
    OutputValue,
    Peer,
    ProbeNode,
    QueryStatus,
    RunInference,
    SetPeers,
    SetReportInterval,
    SetResources,
    StartJob,
    StopJob,
    UndrainNode,
    now_utc,
)

log = logging.getLogger("clusterwarden.agent.commands")

MAX_OUTPUTS = 32  # the schema's bound on CommandResult.outputs


# ---------------------------------------------------------------- pure checks


def check_window(
    payload: CommandPayload, now: datetime, leeway_s: float, max_ttl_s: float
) -> str | None:
    """Why the command is outside its validity window at `now`, or None if it is inside."""
    leeway = timedelta(seconds=leeway_s)
    if now > payload.expires_at + leeway:
        return "expired"
    if now < payload.issued_at - leeway:
        return "not_yet_valid"
    # A long-lived command widens the replay window, whatever its signature says.
    if (payload.expires_at - payload.issued_at).total_seconds() > max_ttl_s:
        return "ttl_too_long"
    return None


# Actions that disrupt nothing and are idempotent (a probe, a status query, setting an
# absolute report interval, cancelling one of the node's own running actions) sit outside
# the node's command ordering and fencing: the centre sends them from several services, and
# ordering them against task commands could only make a task's command look stale (a cancel
# refused as stale would leave a terminated task's migration running). They neither need
# nor advance seq and epoch.
# run_inference (the router's, many a second) is one of them: it changes nothing on the node,
# and the router and the executor would otherwise race for the node's sequence numbers.
# set_peers (the collector's absolute list of peers to probe) is one too.
UNORDERED_ACTIONS: frozenset[str] = frozenset({"probe_node", "query_status",
                                               "set_report_interval", "cancel",
                                               "run_inference", "set_peers"})


def fence_of(action: Action) -> str:
    """What a command's epoch fences: its job for a job action, else the node itself."""
    job_id = getattr(action, "job_id", None)
    return f"job:{job_id}" if isinstance(job_id, str) else NODE_FENCE


def check_order(payload: CommandPayload, last_seq: int | None, max_epoch: int | None, *,
                window: int = 0, seq_accepted: Callable[[int], bool] = lambda _: False,
                ) -> str | None:
    """Why the command is older than what was accepted already, or None.

    Senders take a node's seqs from one counter and publish in a second step, so two (two
    executors, or two tasks) can arrive in the other order: a seq below the last one is taken
    once within `window`, still fenced by its epoch (a replay is caught before, by its id)."""
    if payload.action.action in UNORDERED_ACTIONS:
        return None
    if last_seq is not None and payload.seq <= last_seq and (
            payload.seq <= last_seq - window or seq_accepted(payload.seq)):
        return "stale_seq"
    # A lower epoch comes from an executor that lost its lease (fencing token).
    if max_epoch is not None and payload.epoch < max_epoch:
        return "stale_epoch"
    return None


def _mode_change(current: NodeMode, target: NodeMode) -> Effect:
    return Effect(
        "succeeded",
        mode=target,
        outputs={"mode": target, "previous_mode": current, "changed": current != target},
    )


def decide(
    action: Action,
    mode: NodeMode,
    queried: CommandResult | None,
    interval_s: float = 2.0,
    jobs: JobActions | None = None,
) -> Effect:
    """What `action` does on a node in `mode` reporting every `interval_s` (nothing done yet)."""
    # `queried` is the journaled result of the command a query_status asks about; `jobs`
    # decides the job actions (an agent without it runs no jobs). Cancel needs the running
    # actions, so the executor answers it.
    if isinstance(action, DrainNode):
        # "Ensure drained": draining twice is a no-op, and an offline node already takes no work.
        return _mode_change(mode, "draining" if mode == "active" else mode)
    if isinstance(action, UndrainNode | OnlineNode):
        return _mode_change(mode, "active")
    if isinstance(action, OfflineNode):
        if mode == "active":
            return Effect("failed", "not_drained", outputs={"mode": mode})
        return _mode_change(mode, "offline")
    if isinstance(action, QueryStatus):
        return query_effect(action.command_id, queried)
    if isinstance(action, SetReportInterval):
        return Effect(
            "succeeded",
            interval_s=action.interval_s,
            outputs={
                "interval_s": action.interval_s,
                "previous_interval_s": interval_s,
                "changed": action.interval_s != interval_s,
            },
        )
    if isinstance(action, ProbeNode):
        # The answer itself is the proof: the command path works end to end.
        return Effect("succeeded", outputs={"mode": mode, "interval_s": interval_s})
    if isinstance(action, MigrateJob | StartJob | StopJob | SetResources):
        if jobs is None:
            return Effect("failed", "not_supported", outputs={"job_id": action.job_id})
        return jobs.decide(action, mode)
    return Effect("failed", "not_supported")


def query_effect(command_id: UUID, queried: CommandResult | None) -> Effect:
    """The answer to query_status: the earlier command's journaled outcome, or unknown."""
    if queried is None:
        return Effect(
            "unknown", "not_in_journal", outputs={"queried_command_id": str(command_id)}
        )
    outputs: dict[str, OutputValue] = {
        "queried_command_id": str(command_id),
        "queried_action": queried.action or "",
    }
    for key, value in queried.outputs.items():
        if len(outputs) >= MAX_OUTPUTS:
            break
        outputs.setdefault(key, value)
    return Effect(queried.outcome, queried.reason, outputs=outputs)


def _command_id_of(encoded_payload: str) -> UUID | None:
    """The command id of a payload that failed validation, if one can be read at all."""
    try:
        raw = json.loads(unb64url(encoded_payload))
        return UUID(str(raw["command_id"]))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


# ---------------------------------------------------------------- executor


class CommandExecutor:
    """Checks and executes the commands addressed to one node, journaling every answer."""

    def __init__(
        self,
        node_id: str,
        cluster_id: str,
        verifier: CommandVerifier,
        journal: Journal,
        *,
        leeway_s: float = 30.0,
        max_ttl_s: float = 300.0,
        seq_window: int = 600_000,
        fault_plan: Callable[[], FaultPlan] = FaultPlan,
        default_interval_s: float = 2.0,
        jobs: JobActions | None = None,
        models: ModelServer | None = None,
        inference_journal: InferenceJournal | None = None,
        publish: Callable[[CommandResult], Awaitable[None]] | None = None,
        set_peers: Callable[[list[Peer]], Mapping[str, object]] | None = None,
        clock: Clock = now_utc,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.verifier = verifier
        self.journal = journal
        self.leeway_s = leeway_s
        self.max_ttl_s = max_ttl_s
        self.seq_window = seq_window
        self.fault_plan = fault_plan
        self.default_interval_s = default_interval_s
        self.jobs = jobs
        # run_inference answers go to a journal of their own, next to this one: bounded, and
        # without an fsync each (agent/inference.py InferenceJournal says why).
        self.inference = InferenceActions(models, fault_plan, inference_journal or (
            InferenceJournal.open(journal.path.parent,
                                  keep_at_least_s=replay_window_s(max_ttl_s, leeway_s))))
        # Where the result of a long action goes when it ends (the agent publishes it).
        self.publish = publish
        # Where the centre's peer assignment goes (the agent's prober checks it again).
        self.set_peers = set_peers
        self.clock = clock
        self.source = f"agent-{node_id}"[:IDENTIFIER_MAX]
        self._running: dict[UUID, asyncio.Task[CommandResult]] = {}
        self._cancel_reasons: dict[UUID, str] = {}
        self._publishing: set[asyncio.Task[None]] = set()
        # A new executor runs nothing yet: whatever the journal says is in progress belongs
        # to an agent process that is gone, and will never finish.
        interrupted = [*journal.interrupt_in_progress(clock()),
                       *self._inference_journal.interrupt_in_progress(clock())]
        if interrupted:
            log.warning("long actions interrupted by the agent's restart: %s",
                        ", ".join(str(c) for c in interrupted))

    @property
    def _inference_journal(self) -> InferenceJournal:
        journal = self.inference.journal
        if journal is None:  # set in __init__; a guard for the type checker
            raise RuntimeError("the executor has no inference journal")
        return journal

    def _journal_for(self, action: Action) -> Journal | InferenceJournal:
        """Where a command's result is journaled: run_inference's in the inference journal."""
        return self._inference_journal if isinstance(action, RunInference) else self.journal

    def cached_result(self, command_id: UUID) -> CommandResult | None:
        """The result journaled for `command_id` in either journal."""
        return (self.journal.cached_result(command_id)
                or self._inference_journal.cached_result(command_id))

    def close(self) -> None:
        """Close the inference journal (the command journal is the agent's to close)."""
        self.inference.close()

    @property
    def interval_s(self) -> float:
        """The report interval in force: the centre's if it set one, else the configured one."""
        journaled = self.journal.interval_s
        return self.default_interval_s if journaled is None else journaled

    def running(self) -> dict[UUID, asyncio.Task[CommandResult]]:
        """The long actions still running, by command id."""
        return {cid: task for cid, task in self._running.items() if not task.done()}

    def handle(self, command: Command, now: datetime) -> CommandResult | None:
        """The result to publish for `command` now, or None.

        None: the command is for another node, or it started a long action whose result
        goes to `publish` when the action ends (a duplicate of it gets None too).
        """
        # The command topic is shared: most commands on it are simply not ours.
        if command.subject != self.node_id or command.cluster_id != self.cluster_id:
            return None
        try:
            # kid, alg, signature: PermanentError
            authorised = self.verifier.authorise(command)
        except ValidationError as err:
            return self._invalid_payload(command, err, now)
        payload = authorised.payload

        # The signed audience, not just the envelope: a node of the same name in another
        # cluster has its own seq and epochs, so its commands must never be taken here.
        if (payload.cluster_id, payload.node_id) != (self.cluster_id, self.node_id):
            return self._reject(command, payload, "wrong_audience", now)
        # A real signature of a signer that may not do this (a collector's drain), or of a
        # key revoked since.
        if authorised.refusal is not None:
            return self._reject(command, payload, authorised.refusal, now)

        # Before the window: a replay of a command executed here is answered with what it
        # did (`duplicate`), however late, never `expired` as if it had not run.
        cached = self.cached_result(payload.command_id)
        if cached is not None:
            if payload.command_id in self.running():
                log.info("command %s is a duplicate of a running action; its result follows",
                         payload.command_id)
                return None
            log.info("command %s is a duplicate; answering with the cached result",
                     payload.command_id)
            return cached.model_copy(
                update={"event_id": uuid4(), "occurred_at": now, "duplicate": True}
            )

        window = check_window(payload, now, self.leeway_s, self.max_ttl_s)
        if window is not None:
            return self._reject(command, payload, window, now)

        last_seq = self.journal.last_seq
        fence = fence_of(payload.action)
        order = check_order(payload, last_seq, self.journal.max_epoch_for(fence),
                            window=self.seq_window, seq_accepted=self.journal.seq_accepted)
        if order is not None:
            return self._reject(command, payload, order, now)
        if last_seq is not None and payload.seq < last_seq:
            # (A gap is normal: the centre's seqs follow its clock, services/shared/counters.py.)
            log.info("command seq %d after %d: taken out of order (window %d)", payload.seq,
                     last_seq, self.seq_window)

        return self._execute(command, payload, now)

    def _decide(self, action: Action, mode: NodeMode, interval_s: float,
                command_id: UUID) -> Effect:
        if isinstance(action, Cancel):
            return self._decide_cancel(action)
        if isinstance(action, RunInference):
            return self.inference.decide(action, mode, command_id)
        if isinstance(action, SetPeers):
            return self._decide_peers(action)
        queried = self.cached_result(action.command_id) if isinstance(action, QueryStatus) else None
        return decide(action, mode, queried, interval_s, self.jobs)

    def _decide_peers(self, action: SetPeers) -> Effect:
        set_peers = self.set_peers
        if set_peers is None:
            return Effect("failed", "not_supported")
        listed = len(action.peers)

        def assign() -> Effect:
            taken = len(set_peers(list(action.peers)))
            return Effect("succeeded", outputs={"peers": taken, "refused": listed - taken})

        return Effect("succeeded", outputs={"peers": listed}, apply=assign,
                      plan=f"probe the {listed} peer(s) the centre assigned")

    def _decide_cancel(self, action: Cancel) -> Effect:
        target = action.command_id
        task = self.running().get(target)
        known = self.cached_result(target)
        outputs: dict[str, OutputValue] = {"queried_command_id": str(target)}
        if task is None:
            # Finished, never seen, or not a long action: there is nothing left to stop.
            outputs |= {"cancelled": False,
                        "queried_outcome": known.outcome if known else "not_in_journal"}
            return Effect("succeeded", outputs=outputs)
        outputs |= {"cancelled": True,
                    "queried_action": (known.action or "") if known is not None else ""}

        def cancel() -> Effect:
            self._cancel_reasons[target] = "cancelled"
            task.cancel()
            return Effect("succeeded", outputs=outputs)

        return Effect("succeeded", outputs=outputs, apply=cancel,
                      plan=f"cancel the running command {target}")

    def _execute(
        self, command: Command, payload: CommandPayload, now: datetime
    ) -> CommandResult | None:
        action = payload.action
        mode = self.journal.mode
        interval_s = self.interval_s
        effect = self._decide(action, mode, interval_s, payload.command_id)
        if payload.dry_run:
            outputs: dict[str, OutputValue] = {
                "dry_run": True, "mode": mode, "interval_s": interval_s
            }
            if effect.mode is not None:
                outputs["target_mode"] = effect.mode
            if effect.interval_s is not None:
                outputs["target_interval_s"] = effect.interval_s
            if action.action in JOB_ACTIONS or isinstance(action, Cancel):
                # What the action would do and report, short of doing it.
                for key, value in effect.outputs.items():
                    if len(outputs) >= MAX_OUTPUTS - 1:  # room for the plan
                        break
                    outputs.setdefault(key, value)
                if effect.plan:
                    outputs["plan"] = effect.plan
            effect = Effect(effect.outcome, effect.reason, None, outputs,
                            inference=effect.inference)
        elif action.action in self.fault_plan().fail_actions and effect.outcome == "succeeded":
            effect = Effect("failed", "injected_failure", None, {"mode": mode})
        else:
            if effect.apply is not None:
                effect = self._apply(action.action, effect.apply)
            if effect.run is not None and effect.outcome == "succeeded":
                self._start_long(command, payload, effect, now)
                return None

        result = self._result(command, payload.command_id, payload, effect.outcome,
                              effect.reason, effect.outputs, now, effect.inference)
        # Journal (and change the mode or interval) in one transaction before anyone sees the
        # result.
        ordered = action.action not in UNORDERED_ACTIONS
        self._journal_for(action).record(result, seq=payload.seq if ordered else None,
                                         epoch=payload.epoch if ordered else None,
                                         accepted=True, mode=effect.mode,
                                         interval_s=effect.interval_s,
                                         fence=fence_of(action), now=now)
        log.info("command %s %s: %s %s %s", payload.command_id, action.action, effect.outcome,
                 effect.reason, effect.outputs)
        return result

    @staticmethod
    def _apply(name: str, apply: Callable[[], Effect]) -> Effect:
        try:
            return apply()
        except Exception:
            # A job action that breaks is a failed command, not a dead agent; the job
            # actions already turn the failures they expect into reasons.
            log.exception("action %s failed", name)
            return Effect("failed", "job_error")

    # ------------------------------------------------------------ long actions

    def _start_long(
        self, command: Command, payload: CommandPayload, effect: Effect, now: datetime
    ) -> None:
        run = effect.run
        if run is None:
            raise ValueError("a long action needs something to run")
        loop = asyncio.get_running_loop()  # before journaling: without a loop nothing runs
        pending = self._result(command, payload.command_id, payload, "unknown", IN_PROGRESS,
                               effect.outputs, now)
        # Accepted now: it takes its place in the ordering (unless it is outside it), and a
        # replay is a duplicate.
        ordered = payload.action.action not in UNORDERED_ACTIONS
        self._journal_for(payload.action).record(
            pending, seq=payload.seq if ordered else None,
            epoch=payload.epoch if ordered else None, accepted=True,
            fence=fence_of(payload.action), now=now)
        task = loop.create_task(self._finish_long(command, payload, run),
                                name=f"command-{payload.command_id}")
        task.add_done_callback(partial(self._long_done, command, payload))
        self._running[payload.command_id] = task
        log.info("command %s %s: started %s", payload.command_id, payload.action.action,
                 effect.outputs)

    async def _finish_long(
        self, command: Command, payload: CommandPayload, run: Callable[[], Awaitable[Effect]]
    ) -> CommandResult:
        command_id = payload.command_id
        try:
            effect = await run()
        except asyncio.CancelledError:
            reason = self._cancel_reasons.pop(command_id, "cancelled")
            # Answered as failed: whoever cancelled it still gets the command's result.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            effect = Effect("failed", reason)
        except Exception:
            log.exception("command %s %s failed", command_id, payload.action.action)
            effect = Effect("failed", "job_error")
        result = self._result(command, command_id, payload, effect.outcome, effect.reason,
                              effect.outputs, self.clock(), effect.inference)
        if self._complete(result, payload):
            await self._publish(result)
        return result

    def _complete(self, result: CommandResult, payload: CommandPayload) -> bool:
        """Journal a long action's result; False if it was journaled already."""
        try:
            completed = self._journal_for(payload.action).complete(result)
        except sqlite3.Error:
            # Still in progress in the journal: a restarted agent answers it "interrupted".
            log.exception("journaling the result of command %s failed", result.command_id)
            return True
        if completed:
            log.info("command %s %s: %s %s %s", result.command_id, payload.action.action,
                     result.outcome, result.reason, result.outputs)
        return completed

    async def _publish(self, result: CommandResult) -> None:
        if self.publish is None:
            return
        try:
            await self.publish(result)
        except Exception:
            # Journaled: the centre's query_status gets it.
            log.exception("publishing the result of command %s failed", result.command_id)

    def _long_done(
        self, command: Command, payload: CommandPayload, task: asyncio.Task[CommandResult]
    ) -> None:
        self._running.pop(payload.command_id, None)
        if not task.cancelled():
            return
        # Cancelled before its coroutine ever ran (or while publishing): the journal must
        # still end the action, and whoever waits must still hear of it.
        reason = self._cancel_reasons.pop(payload.command_id, "cancelled")
        result = self._result(command, payload.command_id, payload, "failed", reason, {},
                              self.clock())
        if self._complete(result, payload):
            publishing = asyncio.get_running_loop().create_task(self._publish(result))
            self._publishing.add(publishing)
            publishing.add_done_callback(self._publishing.discard)

    async def shutdown(self) -> None:
        """Stop the long actions still running; each answers failed "interrupted"."""
        tasks = self.running()
        for command_id, task in tasks.items():
            self._cancel_reasons[command_id] = "interrupted"
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        if self._publishing:
            await asyncio.gather(*self._publishing, return_exceptions=True)

    def _reject(
        self, command: Command, payload: CommandPayload, reason: str, now: datetime
    ) -> CommandResult:
        result = self._result(command, payload.command_id, payload, "rejected", reason, {}, now)
        self.journal.record(result, seq=payload.seq, epoch=payload.epoch, accepted=False,
                            now=now)
        log.warning("command %s %s rejected: %s (seq %d, epoch %d)", payload.command_id,
                    payload.action.action, reason, payload.seq, payload.epoch)
        return result

    def _invalid_payload(
        self, command: Command, err: ValidationError, now: datetime
    ) -> CommandResult:
        problem = describe_validation_error(err)
        command_id = _command_id_of(command.payload)
        if command_id is None:
            # Without a command id there is nobody to answer: dead-letter it.
            raise problem from err
        result = self._result(command, command_id, None, "rejected", "invalid_payload",
                              {"error": short_text(problem.reason)}, now)
        self.journal.record(result, seq=None, epoch=None, accepted=False, now=now)
        log.warning("command %s rejected: invalid payload: %s", command_id, problem)
        return result

    def _result(
        self,
        command: Command,
        command_id: UUID,
        payload: CommandPayload | None,
        outcome: Outcome,
        reason: str,
        outputs: dict[str, OutputValue],
        now: datetime,
        inference: InferenceOutput | None = None,
    ) -> CommandResult:
        action: ActionName | None = payload.action.action if payload is not None else None
        return CommandResult(
            event_id=uuid4(),
            source=self.source,
            occurred_at=now,
            cluster_id=self.cluster_id,
            subject=self.node_id,
            correlation_id=command.correlation_id,
            command_id=command_id,
            node_id=self.node_id,
            task_id=payload.task_id if payload is not None else None,
            step_index=payload.step_index if payload is not None else None,
            action=action,
            outcome=outcome,
            reason=reason,
            outputs=outputs,
            inference=inference,
        )
