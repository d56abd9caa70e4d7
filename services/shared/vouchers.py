"""Vouchers: a producer's word, in Redis, that it published a message that makes something
happen, checked by the consumer before it acts.

Anyone who can reach the broker can publish on any topic, and the executor signs with the
real key the commands a task's steps send. Two of its inputs would let a stranger act:

**Dispatches** (`ops.tasks.scheduled.v1`). A forged dispatch would skip the breaker, the
short-circuit, the budget, the rate limit and the locks, or carry an epoch of 2^63-1 that
fences every genuine command out of a node. So the scheduler, when it takes a task's epoch,
records in the same atomic step which task it dispatched with that epoch (`Keys.dispatch`
= `<epoch>:<digest of the task>`, living as long as the task's locks), and the executor acts
on a dispatch only when the record says so:

* the digest differs, or there is no record: the task was never dispatched as it reads
  (forged, or changed on the way) -> refused;
* the epoch is above the recorded one: an epoch the scheduler never issued -> refused;
* the epoch is the recorded one: genuine;
* the epoch is below it: an earlier dispatch of the same task, redelivered after a newer one
  -> handed on, and the executor's journal ignores it as stale, as before.

**Operator controls** (`ops.task-control.v1`). A forged control would pause, terminate,
retry or jump a task past the API's roles and its audit log. So the API, after it audited a
control and before it publishes it, records the control's digest under its event id
(`Keys.control_voucher`, for `CONTROL_VOUCHER_TTL_S`), and the executor applies only a
control whose digest is recorded.

A digest is SHA-256 of the message's JSON as the model writes it: producer and consumer
read the same message through the same model, so both write the same bytes. A voucher is
not a signature: it holds against whoever can reach the broker and not Redis (Redis has its
own users and passwords).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from redis.asyncio import Redis

from common.clock import epoch_ms
from schemas.envelope import Envelope
from schemas.events.v1 import OpsTask, TaskControl
from services.shared.counters import RISING_LUA
from services.shared.redis_client import Keys, text

# KEYS[1] the epoch counter, KEYS[2] the task's dispatch record; ARGV[1] the task's digest,
# ARGV[2] how long the record lives (ms), ARGV[3] the least epoch now (services/shared/
# counters.py: never one given before, even by a Redis that lost its recent state). Returns
# the new epoch.
ISSUE = RISING_LUA + """
local epoch = rising(KEYS[1], tonumber(ARGV[3]))
redis.call('SET', KEYS[2], epoch .. ':' .. ARGV[1], 'PX', ARGV[2])
return epoch
"""

Verdict = Literal["genuine", "earlier", "refused"]


CONTROL_VOUCHER_TTL_S = 24 * 3600.0
"""How long a control stays vouched for: longer than the executor is ever expected to be
down (its consumer reads the control when it is back); a control older than that is refused
and the operator sends it again."""


def digest(message: Envelope) -> str:
    return hashlib.sha256(message.model_dump_json().encode()).hexdigest()


@dataclass(frozen=True)
class DispatchCheck:
    verdict: Verdict
    reason: str = ""


def judge(record: str | None, task: OpsTask, epoch: int) -> DispatchCheck:
    """What a dispatch of `task` with `epoch` is, given the scheduler's record (pure)."""
    if record is None:
        return DispatchCheck("refused", f"no dispatch of task {task.task_id} is recorded")
    recorded_epoch, _, recorded_digest = record.partition(":")
    if recorded_digest != digest(task):
        return DispatchCheck("refused", f"task {task.task_id} differs from the one dispatched")
    if not recorded_epoch.isdigit() or epoch > int(recorded_epoch):
        return DispatchCheck("refused", f"epoch {epoch} of task {task.task_id} was never "
                                        f"issued (the last is {recorded_epoch})")
    return DispatchCheck("genuine" if epoch == int(recorded_epoch) else "earlier")


class Dispatches:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._issue = redis.register_script(ISSUE)

    async def issue(self, task: OpsTask, ttl_s: float, now: datetime) -> int:
        """The next epoch, recorded as `task`'s dispatch (the scheduler's, at dispatch)."""
        return int(await self._issue(keys=[self.keys.epoch(), self.keys.dispatch(
            str(task.task_id))], args=[digest(task), max(1, int(ttl_s * 1000)),
                                       epoch_ms(now)]))

    async def check(self, task: OpsTask, epoch: int) -> DispatchCheck:
        """The executor's check of a dispatch it received."""
        raw = await self.redis.get(self.keys.dispatch(str(task.task_id)))
        return judge(None if raw is None else text(raw), task, epoch)


class ControlVouchers:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def vouch(self, control: TaskControl) -> None:
        """The API's word that it audited and publishes `control`."""
        await self.redis.set(self.keys.control_voucher(str(control.event_id)), digest(control),
                             px=int(CONTROL_VOUCHER_TTL_S * 1000))

    async def check(self, control: TaskControl) -> str | None:
        """None if the API vouched for `control` as it reads; else why it is refused."""
        raw = await self.redis.get(self.keys.control_voucher(str(control.event_id)))
        if raw is None:
            return (f"control {control.event_id} for task {control.task_id} was not sent "
                    "through the API (or is older than its voucher)")
        if text(raw) != digest(control):
            return f"control {control.event_id} differs from the one the API sent"
        return None
