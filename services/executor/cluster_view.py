"""The centre's read of the cluster: a pool's up nodes and one node, as the collector keeps them.

Reads only: the collector owns these keys (node hashes, the pool aggregate and its index of
up nodes) and the router owns queued demand. Each read is pipelined: one round trip for the
index, the aggregate and the demand, one more for the nodes.
"""

from __future__ import annotations

from typing import cast, get_args

from redis.asyncio import Redis

from schemas.events.v1 import NodeStateName
from services.executor.health import AgentHealth
from services.executor.planning import JobKind, JobRef, NodeView, PoolView
from services.shared.redis_client import Keys, text

_FIELDS = ("state", "mode", "gpu_util", "gpus", "jobs", "job_count", "pool")
_STATES: tuple[str, ...] = get_args(NodeStateName)
_KINDS: tuple[str, ...] = get_args(JobKind)


def parse_jobs(compact: str) -> tuple[JobRef, ...]:
    """The node hash's "job_id:kind:state,..." back as jobs (unknown kinds are skipped)."""
    jobs = []
    for entry in compact.split(","):
        job_id, _, rest = entry.partition(":")
        kind, _, state = rest.partition(":")
        if job_id and kind in _KINDS:
            jobs.append(JobRef(job_id, cast(JobKind, kind), state))
    return tuple(jobs)


def node_view(node_id: str, values: list[bytes | str | None]) -> NodeView | None:
    """A node from its hash fields (in `_FIELDS` order); None if the collector never saw it."""
    state, mode, util, gpus, jobs, job_count, pool = (
        None if v is None else text(v) for v in values
    )
    if state is None or pool is None:
        return None
    listed = parse_jobs(jobs or "")
    return NodeView(
        node_id=node_id, pool=pool, state=state,
        # Written by every report since the centre plans from it; a hash from before that
        # has none, and its state then says it all.
        mode=mode or ("active" if state == "up" else state),
        util_pct=float(util or 0.0),
        gpus=int(gpus) if gpus is not None else 1,
        jobs=listed,
        job_count=int(job_count) if job_count is not None else len(listed),
    )


class ClusterView:
    """Fresh views of pools and nodes for guards and plans."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def pool(self, cluster: str, pool: str) -> PoolView:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(self.keys.pool_nodes(cluster, pool), 0, -1)
            pipe.hgetall(self.keys.pool(cluster, pool))
            pipe.get(self.keys.demand(cluster, pool))
            members, aggregate, demand = await pipe.execute()
        names = sorted(text(m) for m in members)
        nodes: list[NodeView] = []
        if names:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hmget(self.keys.node(cluster, name), list(_FIELDS))
                rows = await pipe.execute()
            for name, row in zip(names, rows, strict=True):
                view = node_view(name, row)
                # The index and the hash change in one script; a node read between two
                # reads that left up meanwhile is simply not counted.
                if view is not None and view.state == "up" and view.pool == pool:
                    nodes.append(view)
        fields = {text(k): text(v) for k, v in aggregate.items()}
        counts = {state: max(0, int(fields.get(f"n_{state}", "0"))) for state in _STATES}
        return PoolView(
            cluster=cluster, pool=pool, nodes=tuple(nodes),
            counts={state: n for state, n in counts.items() if n},
            demand_pct=float(text(demand)) if demand is not None else 0.0,
        )

    async def last_report(self, cluster: str, node: str) -> float | None:
        """When the node's latest applied report was sent (epoch seconds); None: never."""
        raw = await self.redis.hget(self.keys.node(cluster, node), "last_report_at")
        return None if raw is None else float(text(raw))

    async def node(self, cluster: str, node: str) -> NodeView | None:
        row = await self.redis.hmget(self.keys.node(cluster, node), list(_FIELDS))
        return node_view(node, row)

    async def agent_health(self, cluster: str, node: str) -> AgentHealth | None:
        """The node's agent as the collector last recorded it; None: it never reported."""
        state, faults, fault_at = (
            None if v is None else text(v) for v in await self.redis.hmget(
                self.keys.node(cluster, node), ["state", "fault_count", "fault_at"]))
        if state is None:
            return None
        return AgentHealth(state=state, fault_count=int(faults or 0),
                           fault_at=float(fault_at) if fault_at is not None else None)
