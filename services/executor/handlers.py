"""Executor handlers: a scheduled task starts a workflow; results, deadlines, retries, child
tasks and operator controls advance it.

`Executor` is where the executor's parts are put together, and what the app subscribes:
* the workflow core (`workflow.py`) runs steps and ends them;
* recovery (`recovery.py`) sweeps deadlines and retries, and asks about lost commands;
* operator controls (`operator_controls.py`) pause, resume, retry, terminate and jump;
* the command sender (`commands.py`) signs and publishes what agents carry out;
* the emitter (`events.py`) announces every transition as a TaskEvent.
They share nothing but the Redis journal (and the locks); no workflow state is in memory.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from common.clock import Clock
from common.errors import PermanentError
from common.signing import CommandSigner
from schemas.events.v1 import CommandResult, TaskControl, TaskScheduled, now_utc
from services.executor.broker_health import BrokerHealth, BrokerProbe, always_reachable
from services.executor.commands import CommandSender
from services.executor.events import TaskEvents
from services.executor.journal import CANCEL_MARK, QUERY_MARK, Journal
from services.executor.operator_controls import OperatorControls
from services.executor.ports import BackendSteps, CentreActions, Publisher
from services.executor.recovery import Recovery
from services.executor.settings import ExecutorSettings
from services.executor.workflow import WorkflowCore
from services.shared.locks import Locks
from services.shared.redis_client import Keys
from services.shared.vouchers import ControlVouchers, Dispatches

log = logging.getLogger("clusterwarden.executor")


class Executor:
    """The executor's handlers: one object per process, wired from its parts."""

    def __init__(self, settings: ExecutorSettings, journal: Journal, signer: CommandSigner,
                 bus: Publisher, redis: Redis, keys: Keys, centre: CentreActions, *,
                 clock: Clock = now_utc, backends: BackendSteps | None = None,
                 broker_probe: BrokerProbe = always_reachable) -> None:
        self.settings = settings
        self.journal = journal
        self.signer = signer
        locks = Locks(redis, keys)
        self.events = TaskEvents(bus, clock)
        self.commands = CommandSender(settings, journal, signer, bus, clock)
        self.workflow = WorkflowCore(settings, journal, locks, centre, self.events,
                                     self.commands, clock, backends)
        self.recovery = Recovery(settings, journal, self.workflow, self.commands, self.events,
                                 clock, BrokerHealth(redis, keys, clock, broker_probe))
        self.controls = OperatorControls(settings, journal, locks, self.workflow,
                                         self.commands, self.events)
        self.dispatches = Dispatches(redis, keys)
        self.control_vouchers = ControlVouchers(redis, keys)

    async def on_scheduled(self, scheduled: TaskScheduled) -> None:
        """A dispatched task, acted on only if the scheduler's record says it dispatched
        this task with this epoch (services/shared/vouchers.py); a forged one is
        dead-lettered, and nothing of it runs."""
        check = await self.dispatches.check(scheduled.task, scheduled.epoch)
        if check.verdict == "refused":
            log.warning("dispatch of task %s refused: %s", scheduled.task.task_id, check.reason)
            raise PermanentError("unknown_dispatch", check.reason)
        await self.workflow.on_scheduled(scheduled)

    async def on_result(self, result: CommandResult) -> None:
        """An agent's answer: to a step's command, a status query, or a cancel."""
        indexed = await self.journal.task_of_command(str(result.command_id))
        if indexed is None:
            return  # not a command of ours (or its index expired)
        if indexed.startswith(CANCEL_MARK):
            log.info("cancel %s for task %s: %s %s %s", result.command_id,
                     indexed.removeprefix(CANCEL_MARK), result.outcome, result.reason,
                     dict(result.outputs))
            return
        if indexed.startswith(QUERY_MARK):
            await self.recovery.on_query_answer(indexed.removeprefix(QUERY_MARK), result)
            return
        await self.workflow.on_result(indexed, result)

    async def on_control(self, control: TaskControl) -> None:
        """An operator's control, applied only if the API vouched for it (it checked the
        operator's role and audited it); a forged one is dead-lettered."""
        if (refused := await self.control_vouchers.check(control)) is not None:
            log.warning("control refused: %s", refused)
            raise PermanentError("unvouched_control", refused)
        await self.controls.on_control(control)

    async def sweep_deadlines(self) -> None:
        await self.recovery.sweep_deadlines()

    async def renew_locks(self) -> None:
        await self.recovery.renew_locks()

    async def idle(self) -> None:
        """Until no step runs through a cluster's backend (they run beside the consumers)."""
        await self.workflow.idle()

    async def stop(self) -> None:
        await self.workflow.stop()
