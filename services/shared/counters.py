"""Counters that never go back: the fencing epoch and each node's command seq.

Agents refuse a command whose epoch is older than one its fence accepted, or whose seq they
took before. Both numbers come from Redis counters, and a Redis that loses its recent state (a
snapshot restored after a lost fsync, a failover to a replica that lagged) would hand out
again numbers the agents have already seen: every command after it would be refused
`stale_epoch` or `stale_seq`, for good, and no task could touch those nodes again (S11 in
docs/reliability.md). So each number is also at least the centre's clock in milliseconds: a
counter that went back starts again above everything it gave before (centres' clocks
agreeing to within the time Redis lost). Between two ticks of the clock a counter still counts
one by one, so numbers taken together stay together (an agent's seq window, agent/commands.py,
takes one that arrived late).
"""

from __future__ import annotations

from datetime import datetime

from redis.asyncio import Redis

from common.clock import epoch_ms

# Prepended to a script that takes a number: `rising(key, floor)` is the counter's next value,
# at least `floor`.
RISING_LUA = """
local function rising(key, floor)
  local value = redis.call('INCR', key)
  if value < floor then
    redis.call('SET', key, floor)
    value = floor
  end
  return value
end
"""

NEXT = RISING_LUA + "return rising(KEYS[1], tonumber(ARGV[1]))"


class RisingCounters:
    """Takes the next value of any counter key, never below the clock."""

    def __init__(self, redis: Redis) -> None:
        self._next = redis.register_script(NEXT)

    async def next(self, key: str, now: datetime) -> int:
        # The least number it may give at `now`: the clock in milliseconds.
        return int(await self._next(keys=[key], args=[epoch_ms(now)]))
