"""The selector's statistics in Redis, shared by every router instance.

One hash per statistics entry (`arm:<model>@<node>`, `model:<model>`, `node:<node>`,
`family:<family>`, `global`), in the selector's own flat codec
(services/router/policy/codec.py). Changes are written inside the caller's optimistic
transaction (WATCH ... MULTI/EXEC): an arm's in-flight count or a level's counts changed by
another instance between read and write aborts the transaction, which is then run again on
fresh values. That is what makes the per-target concurrency limit and the single half-open
trial hold across instances.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from common.errors import TransientError
from services.router.policy.codec import decode_arm, decode_counts, encode_arm, encode_counts
from services.router.policy.stats import StatsSnapshot
from services.shared.redis_client import Keys

T = TypeVar("T")
# Every hash of KEYS, as flat field/value lists, in one round trip: one JSON text (an
# empty hash is `{}` there), since a reply of thousands of small strings costs the client
# far more to parse than the same values in one string.
_READ_ALL = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGETALL', key) end
return cjson.encode(out)
"""
ARM_PREFIX = "arm:"
# Optimistic transactions retried this often before the message is retried as transient.
MAX_TRANSACTION_ATTEMPTS = 50


def is_arm(stat_key: str) -> bool:
    return stat_key.startswith(ARM_PREFIX)


async def optimistic(redis: Redis, watch: Sequence[str],
                     body: Callable[[Pipeline], Awaitable[T]],
                     attempts: int = MAX_TRANSACTION_ATTEMPTS) -> T:
    """Run `body` as one optimistic transaction on the `watch` keys, again on conflict.

    `body` reads through the pipeline (immediately: the keys are watched), then calls
    `pipe.multi()` and queues its writes; they commit only if no watched key changed.
    """
    for _ in range(attempts):
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(*watch)
                result = await body(pipe)
                await pipe.execute()
            except WatchError:
                continue
            return result
    raise TransientError(f"{attempts} conflicting writes in a row on {len(watch)} keys")


def begin_writes(pipe: Pipeline) -> None:
    """MULTI: the reads of a watched transaction are done, its writes follow."""
    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated


class StatsStore:
    """Reads and writes snapshot entries of one cluster."""

    def __init__(self, keys: Keys, ttl_s: int) -> None:
        self.keys = keys
        self.ttl_s = ttl_s

    def redis_keys(self, cluster: str, stat_keys: Iterable[str]) -> list[str]:
        return [self.keys.ml_stats(cluster, k) for k in stat_keys]

    async def read(self, reader: Redis | Pipeline, cluster: str,
                   stat_keys: Iterable[str]) -> StatsSnapshot:
        """The entries under `stat_keys` (missing ones are simply absent: zero).

        One round trip for all of them (a script), also inside a watched transaction.
        """
        wanted = sorted(set(stat_keys))
        if not wanted:
            return StatsSnapshot()
        reply = await reader.eval(_READ_ALL, len(wanted), *self.redis_keys(cluster, wanted))
        replies: list[list[str] | dict[str, str]] = json.loads(reply)
        levels = {}
        arms = {}
        for stat_key, flat in zip(wanted, replies, strict=True):
            if not isinstance(flat, list) or not flat:  # missing (an empty hash: `{}`)
                continue
            values = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
            if is_arm(stat_key):
                arms[stat_key] = decode_arm(values)
            else:
                levels[stat_key] = decode_counts(values)
        return StatsSnapshot(levels=levels, arms=arms)

    def write(self, pipe: Pipeline, cluster: str, before: StatsSnapshot,
              after: StatsSnapshot) -> int:
        """Queue the entries that changed from `before` to `after`; how many.

        Every changed entry, not only the arm an outcome ran on: a change point rewrites
        the other arms of its model or node that were read (the caller watches them all).
        """
        changed = 0
        for stat_key, counts in after.levels.items():
            if before.levels.get(stat_key) != counts:
                self._set(pipe, cluster, stat_key, encode_counts(counts))
                changed += 1
        for stat_key, arm in after.arms.items():
            if before.arms.get(stat_key) != arm:
                self._set(pipe, cluster, stat_key, encode_arm(arm))
                changed += 1
        return changed

    def _set(self, pipe: Pipeline, cluster: str, stat_key: str,
             values: dict[str, float]) -> None:
        key = self.keys.ml_stats(cluster, stat_key)
        # repr: the exact float, so a replayed decision reads exactly what this one wrote.
        pipe.hset(key, mapping={name: repr(value) for name, value in values.items()})
        pipe.expire(key, self.ttl_s)
