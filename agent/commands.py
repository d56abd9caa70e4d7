"""Verifying and executing signed commands, in the order RELIABILITY.md §4.4 sets.

Every check runs before any side effect. A command that fails its key, algorithm or
signature check raises PermanentError (it is dead-lettered: nobody trustworthy is waiting
for an answer); every other rejection is answered with a `rejected` result and journaled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID, uuid4

from pydantic import ValidationError

from agent.faults import FaultPlan
from agent.journal import Journal
from schemas.events.v1 import (
    Action,
    ActionName,
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    NodeMode,
    OfflineNode,
    OnlineNode,
    OutputValue,
    ProbeNode,
    QueryStatus,
    SetReportInterval,
    UndrainNode,
)
from services.shared.errors import describe_validation_error
from services.shared.signing import CommandVerifier, unb64url

log = logging.getLogger("clusterwarden.agent.commands")

Outcome = Literal["succeeded", "failed", "rejected", "unknown"]
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
# absolute report interval) sit outside the node's command ordering and fencing: the centre
# sends them from several services, and ordering them against task commands could only make
# a task's command look stale. They neither need nor advance seq and epoch.
UNORDERED_ACTIONS: frozenset[str] = frozenset({"probe_node", "query_status",
                                               "set_report_interval"})


def check_order(payload: CommandPayload, last_seq: int | None, max_epoch: int | None) -> str | None:
    """Why the command is older than what was accepted already, or None."""
    if payload.action.action in UNORDERED_ACTIONS:
        return None
    if last_seq is not None and payload.seq <= last_seq:
        return "stale_seq"
    # A lower epoch comes from an executor that lost its lease (fencing token).
    if max_epoch is not None and payload.epoch < max_epoch:
        return "stale_epoch"
    return None


@dataclass(frozen=True)
class Effect:
    """What an action does to the node: the outcome, and the mode or interval to persist."""

    outcome: Outcome
    reason: str = ""
    mode: NodeMode | None = None
    outputs: dict[str, OutputValue] = field(default_factory=dict)
    interval_s: float | None = None


def _mode_change(current: NodeMode, target: NodeMode) -> Effect:
    return Effect(
        "succeeded",
        mode=target,
        outputs={"mode": target, "previous_mode": current, "changed": current != target},
    )


def decide(
    action: Action, mode: NodeMode, queried: CommandResult | None, interval_s: float = 2.0
) -> Effect:
    """What `action` does on a node in `mode` reporting every `interval_s`."""
    # `queried` is the journaled result of the command a query_status asks about.
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
    return Effect("failed", "not_supported_yet")


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
        fault_plan: Callable[[], FaultPlan] = FaultPlan,
        default_interval_s: float = 2.0,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.verifier = verifier
        self.journal = journal
        self.leeway_s = leeway_s
        self.max_ttl_s = max_ttl_s
        self.fault_plan = fault_plan
        self.default_interval_s = default_interval_s
        self.source = f"agent-{node_id}"[:128]

    @property
    def interval_s(self) -> float:
        """The report interval in force: the centre's if it set one, else the configured one."""
        journaled = self.journal.interval_s
        return self.default_interval_s if journaled is None else journaled

    def handle(self, command: Command, now: datetime) -> CommandResult | None:
        """The result to publish for `command`, or None if the command is for another node."""
        # The command topic is shared: most commands on it are simply not ours.
        if command.subject != self.node_id or command.cluster_id != self.cluster_id:
            return None
        try:
            payload = self.verifier.verify(command)  # kid, alg, signature: PermanentError
        except ValidationError as err:
            return self._invalid_payload(command, err, now)

        if payload.node_id != self.node_id:
            return self._reject(command, payload, "wrong_audience", now)
        window = check_window(payload, now, self.leeway_s, self.max_ttl_s)
        if window is not None:
            return self._reject(command, payload, window, now)

        cached = self.journal.cached_result(payload.command_id)
        if cached is not None:
            log.info("command %s is a duplicate; answering with the cached result",
                     payload.command_id)
            return cached.model_copy(
                update={"event_id": uuid4(), "occurred_at": now, "duplicate": True}
            )

        last_seq = self.journal.last_seq
        order = check_order(payload, last_seq, self.journal.max_epoch)
        if order is not None:
            return self._reject(command, payload, order, now)
        if last_seq is not None and payload.seq > last_seq + 1:
            log.info("command seq gap: %d after %d (commands were lost or skipped)",
                     payload.seq, last_seq)

        return self._execute(command, payload, now)

    def _execute(self, command: Command, payload: CommandPayload, now: datetime) -> CommandResult:
        action = payload.action
        mode = self.journal.mode
        queried = (
            self.journal.cached_result(action.command_id)
            if isinstance(action, QueryStatus)
            else None
        )
        interval_s = self.interval_s
        effect = decide(action, mode, queried, interval_s)
        if payload.dry_run:
            outputs: dict[str, OutputValue] = {
                "dry_run": True, "mode": mode, "interval_s": interval_s
            }
            if effect.mode is not None:
                outputs["target_mode"] = effect.mode
            if effect.interval_s is not None:
                outputs["target_interval_s"] = effect.interval_s
            effect = Effect(effect.outcome, effect.reason, None, outputs)
        elif action.action in self.fault_plan().fail_actions and effect.outcome == "succeeded":
            effect = Effect("failed", "injected_failure", None, {"mode": mode})

        result = self._result(command, payload.command_id, payload, effect.outcome,
                              effect.reason, effect.outputs, now)
        # Journal (and change the mode or interval) in one transaction before anyone sees the
        # result.
        ordered = action.action not in UNORDERED_ACTIONS
        self.journal.record(result, seq=payload.seq if ordered else None,
                            epoch=payload.epoch if ordered else None, accepted=True,
                            mode=effect.mode, interval_s=effect.interval_s, now=now)
        log.info("command %s %s: %s %s %s", payload.command_id, action.action, effect.outcome,
                 effect.reason, effect.outputs)
        return result

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
                              {"error": problem.reason[:256]}, now)
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
        )
