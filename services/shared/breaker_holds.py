"""The breakers that stop more than their own kind, as the scheduler and the router read them.

A breaker is named `<kind>` (kind scope), `<kind>@<node>` (node scope) or `<kind>@*` (cluster
scope). While a node- or cluster-scoped breaker is not closed, its name is in its cluster's
hold set (`Keys.breaker_holds`), written by the scheduler's breaker store in the same script
as the breaker itself. The scheduler holds back every ops task such a breaker stops; the
router sends no ML task to a node a node-scoped one stops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from common.clock import EpochClock
from services.shared.redis_client import Keys, text

# Not characters of an Identifier: a name splits back into kind and target, and no node is
# named like the cluster scope's target.
SCOPE_SEPARATOR = "@"
WHOLE_CLUSTER = "*"


async def holding(redis: Redis, keys: Keys, cluster: str) -> set[str]:
    """The node- and cluster-scoped breakers of `cluster` not closed (one round trip)."""
    return {text(name) for name in await redis.smembers(keys.breaker_holds(cluster))}


def stopped_nodes(names: set[str]) -> set[str]:
    """The nodes the node-scoped breakers among `names` stop."""
    found = {name.partition(SCOPE_SEPARATOR)[2] for name in names}
    return found - {"", WHOLE_CLUSTER}


@dataclass
class _Seen:
    at: float
    nodes: set[str]


class StoppedNodes:
    """The nodes of a cluster a breaker stops, read at most once per `cache_s` per cluster."""

    def __init__(self, redis: Redis, keys: Keys, *, cache_s: float = 1.0,
                 clock: EpochClock = time.time) -> None:
        self.redis = redis
        self.keys = keys
        self.cache_s = cache_s
        self.clock = clock
        self._seen: dict[str, _Seen] = {}

    async def of(self, cluster: str) -> set[str]:
        seen = self._seen.get(cluster)
        if seen is not None and self.clock() - seen.at <= self.cache_s:
            return seen.nodes
        nodes = stopped_nodes(await holding(self.redis, self.keys, cluster))
        self._seen[cluster] = _Seen(self.clock(), nodes)
        return nodes
