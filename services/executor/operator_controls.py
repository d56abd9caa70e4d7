"""Operator controls: pause, resume, retry, terminate, jump and restart, applied to a workflow.

What a control does is decided by the pure policy (`control.py`); this applies the decision
to the journal in one compare-and-set transition (the workflow as read, the control not
applied before), announces it as the operator's, then acts on it. A control for a task not
received yet is kept and applied when the task arrives.

Every control on a parent also reaches the open children of the parent's current step (the
only step that can have children still running), each child recording a transition that
names the parent and its control:

* pause, resume and terminate are applied to the children as they are;
* retry and restart run the parent's step again (restart: from the first step), which makes
  new children; jump leaves the step. Either way the children the step had are superseded:
  they are terminated, with the parent's control as the reason.

A child already final (or terminated before it arrived) is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid5

from common.clock import epoch_ms
from common.errors import TransientError
from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import TaskControl, TaskState
from services.executor.commands import CommandSender
from services.executor.control import FINAL_STATES, ControlAction, Decision, decide_control
from services.executor.events import TaskEvents
from services.executor.journal import (
    FinalNotice,
    Journal,
    Patch,
    PauseRequest,
    Transition,
    Workflow,
)
from services.executor.settings import ExecutorSettings
from services.executor.workflow import WorkflowCore
from services.shared.locks import Locks, lock_ttl_s

log = logging.getLogger("clusterwarden.executor")
# What a parent's control does to its open children (see the module docstring).
CHILD_CONTROL: dict[ControlAction, ControlAction] = {
    "pause": "pause", "resume": "resume", "terminate": "terminate",
    "retry": "terminate", "jump": "terminate", "restart": "terminate",
}
_CONTROL_ATTEMPTS = 8


@dataclass(frozen=True)
class Via:
    """The parent control a child's control comes from."""

    parent_task_id: str
    action: ControlAction

    def outputs(self) -> dict[str, Any]:
        return {"parent_task_id": self.parent_task_id, "parent_control": self.action}


def child_control(control: TaskControl, parent_task_id: str, child_id: str) -> TaskControl:
    """The control a parent's `control` becomes for one of its open children."""
    action = CHILD_CONTROL[control.action]
    how = "" if action == control.action else " (superseded)"
    return control.model_copy(update={
        "task_id": UUID(child_id), "action": action, "step_index": None,
        "reason": short_text(f"via parent {parent_task_id} {control.action}{how}: "
                             f"{control.reason}")})


class OperatorControls:
    """Applies operator controls to workflows (and to tasks that have not arrived yet)."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, locks: Locks,
                 core: WorkflowCore, commands: CommandSender, events: TaskEvents) -> None:
        self.settings = settings
        self.journal = journal
        self.locks = locks
        self.core = core
        self.commands = commands
        self.events = events

    async def on_control(self, control: TaskControl) -> None:
        await self.apply_control(control, control.task_id, str(control.event_id))

    async def apply_control(self, control: TaskControl, task_id: UUID, control_id: str,
                            via: Via | None = None) -> None:
        """Apply `control` to `task_id` (the task it names, or one of its children)."""
        for _ in range(_CONTROL_ATTEMPTS):
            wf = await self.journal.load(str(task_id))
            if wf is None:
                done = await self._control_unseen(control, task_id, control_id, via)
            else:
                done = await self._control_workflow(control, wf, control_id, via)
            if done:
                return
        raise TransientError(f"task {task_id} kept changing under control {control_id}")

    async def _control_unseen(self, control: TaskControl, task_id: UUID, control_id: str,
                              via: Via | None) -> bool:
        """A control for a task not received yet: kept, and applied when the task arrives."""
        tid = str(task_id)
        if await self.journal.control_seen(tid, control_id):
            return True
        pending = await self.journal.pending_control(tid)
        state: TaskState = "queued"
        if pending is not None and pending.action == "pause":
            state = "paused"
        elif pending is not None and pending.action == "terminate":
            state = "terminated"
        decision = decide_control(state, None, control.action, control.step_index, 0,
                                  seen=False)
        extra = via.outputs() if via else {}
        if not decision.allowed:
            await self.events.control_unseen(control, task_id, control_id, state,
                                             f"refused {control.action}: {decision.reason}",
                                             refused=True, extra=extra)
            await self.journal.mark_control_seen(tid, control_id)
            return True
        keep = None if decision.new_state == "queued" else control.action
        outcome = await self.journal.keep_pending(tid, control_id, keep, control.actor,
                                                  control.reason)
        if outcome == "exists":
            return False  # the task arrived meanwhile: apply to the workflow
        if outcome == "ok":
            await self.events.control_unseen(control, task_id, control_id, "queued",
                                             f"{control.action}: {control.reason} "
                                             f"({decision.reason})", refused=False,
                                             extra=extra)
        return True

    async def _control_workflow(self, control: TaskControl, wf: Workflow, control_id: str,
                                via: Via | None) -> bool:
        """Decide and apply a control to a journaled workflow; False if it changed meanwhile."""
        if await self.journal.control_seen(wf.task_id, control_id):
            return True
        decision = decide_control(wf.state, wf.step_state, control.action, control.step_index,
                                  len(wf.task.steps), pause_requested=wf.pause is not None)
        if not decision.allowed:
            await self._refuse(control, wf, control_id, decision.reason, via)
            return True
        if self._needs_locks(control, wf, decision):
            held = await self.locks.acquire(
                wf.task_id, wf.task.mutex_keys,
                lock_ttl_s(wf.task, self.settings.lock_margin_s))
            if held is not None:
                await self._refuse(control, wf, control_id,
                                   f"lock {held.lock} is held by task {held.owner}", via)
                return True
        applied = await self._apply(control, wf, control_id, decision, via)
        if applied == "changed":
            return False
        if applied == "duplicate":
            return True  # a redelivered control, applied before
        # Read before the control acts: a step run again starts a fresh set of children.
        children = await self._live_children(wf)
        await self._after_control(control, wf, control_id, decision, via)
        await self._to_children(control, wf, control_id, children)
        return True

    async def _to_children(self, control: TaskControl, wf: Workflow, control_id: str,
                           children: list[str]) -> None:
        """The parent's control reaches the open children of its current step."""
        via = Via(wf.task_id, control.action)
        for child in children:
            await self.apply_control(child_control(control, wf.task_id, child), UUID(child),
                                     str(uuid5(ids.EXECUTOR, f"{control_id}:{child}")), via)

    async def _live_children(self, wf: Workflow) -> list[str]:
        """The current step's children not finished yet (nor terminated before they arrived).

        A child that ends while its parent is not waiting is not counted at the parent, so
        the journal's own list of open children is checked against each child's state."""
        live = []
        for child in await self.journal.open_children(wf.task_id, wf.step):
            child_wf = await self.journal.load(child)
            if child_wf is not None and child_wf.state in FINAL_STATES:
                continue
            if child_wf is None:
                pending = await self.journal.pending_control(child)
                if pending is not None and pending.action == "terminate":
                    continue
            live.append(child)
        return live

    @staticmethod
    def _needs_locks(control: TaskControl, wf: Workflow, decision: Decision) -> bool:
        """Whether the task must hold its locks again: it is about to run (or, jumped from
        a failure, to wait paused for a resume) and may have released or lost them."""
        if control.action in ("retry", "restart"):
            return True
        if control.action == "resume":
            return not decision.withdraw_pause
        return control.action == "jump" and wf.state == "failed"

    async def _apply(self, control: TaskControl, wf: Workflow, control_id: str,
                     decision: Decision, via: Via | None) -> Transition:
        action, transition = control.action, self.journal.transition
        if action == "pause" and decision.at_boundary:
            request = PauseRequest(control.actor, control.reason, control_id)
            return await transition(wf, control_id, Patch(pause=request))
        if action == "pause":
            return await transition(wf, control_id, Patch(state="paused"), timers="clear")
        if action == "resume" and decision.withdraw_pause:
            return await transition(wf, control_id, Patch(clear_pause=True))
        if action == "resume":
            return await transition(wf, control_id, Patch(state="running", clear_pause=True),
                                    timers="kick", kick_ms=self.core.kick_ms())
        if action == "retry":
            return await transition(wf, control_id, Patch(state="running", fresh_run=wf.run + 1),
                                    timers="kick", kick_ms=self.core.kick_ms(), ttl="persist")
        if action == "restart":
            # An epoch taken and not used (the workflow changed meanwhile) is only a gap.
            patch = Patch(state="running", step=0, fresh_run=wf.run + 1,
                          epoch=await self.journal.next_epoch(self.core.clock()))
            return await transition(wf, control_id, patch, timers="kick",
                                    kick_ms=self.core.kick_ms(), ttl="persist")
        if action == "jump":
            return await transition(
                wf, control_id, Patch(state="paused", step=control.step_index,
                                      fresh_run=wf.run + 1), timers="clear", ttl="persist")
        return await transition(
            wf, control_id, Patch(state="terminated", cause="terminated", clear_pause=True,
                                  reason=short_text(f"terminate: {control.reason}"),
                                  final=terminated(control, wf, control_id, via)),
            timers="clear", ttl="expire", now_ms=epoch_ms(self.core.clock()))

    async def _after_control(self, control: TaskControl, wf: Workflow, control_id: str,
                             decision: Decision, via: Via | None) -> None:
        """Announce an applied control (actor: the operator), then act on it."""
        previous = wf.state
        key = f"control:{control_id}"
        reason = f"{control.action}: {control.reason} ({decision.reason})"
        extra = via.outputs() if via else {}
        if control.action == "terminate":
            if not await self.core.runs_in_centre(wf):
                # A backend's step has no agent command to cancel: it ends by itself.
                await self.commands.cancel(wf)
            await self.core.finalise(wf.task, terminated(control, wf, control_id, via))
            return
        state: TaskState = decision.new_state
        if decision.at_boundary or decision.withdraw_pause:
            state = "running"  # the state changes (if at all) when the step ends
        step = {"jump": control.step_index, "restart": 0}.get(control.action, wf.step)
        outputs: dict[str, Any] = {"control": control.action, **extra}
        if control.action == "restart":
            fresh = await self.journal.load(wf.task_id)
            outputs.update(run=wf.run + 1, epoch=fresh.epoch if fresh else wf.epoch)
        await self.events.emit(wf.task, state, previous, step=step, actor=control.actor,
                               reason=reason, outputs=outputs, event_key=key)
        if state == "running" and not (decision.at_boundary or decision.withdraw_pause):
            await self.core.kick(wf.task_id)

    async def _refuse(self, control: TaskControl, wf: Workflow, control_id: str,
                      why: str, via: Via | None = None) -> None:
        extra = via.outputs() if via else {}
        await self.events.emit(wf.task, wf.state, wf.state, step=wf.step, actor=control.actor,
                               reason=f"refused {control.action}: {why}",
                               outputs={"control": control.action, "refused": True, **extra},
                               event_key=f"control:{control_id}")
        await self.journal.mark_control_seen(wf.task_id, control_id)
        log.info("task %s: refused %s by %s: %s", wf.task_id, control.action, control.actor,
                 why)


def terminated(control: TaskControl, wf: Workflow, control_id: str,
               via: Via | None) -> FinalNotice:
    """How an operator's terminate of a journaled workflow announces the task's end."""
    return FinalNotice("terminated", wf.state, f"terminate: {control.reason}",
                       cause="terminated", actor=control.actor, run=wf.run, step=wf.step,
                       event_key=f"control:{control_id}",
                       extra=via.outputs() if via else {})
