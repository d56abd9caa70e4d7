"""The local capacity provider: standby agent processes on this machine.

The standby nodes are configured (CAPACITY_LOCAL_STANDBY); adding one to a pool enrols it
in the cluster's registry first (so its very first report counts), records it, then starts
its agent with no jobs. Releasing one stops its agent, unenrols it and drops its collector
state. Every fact lives in Redis: which standby node serves which pool, and the outcome of
each request id, so a repeated request (a re-run step) starts nothing twice, and any
executor instance can release what another one added.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from agent import fleet
from services.capacity.provider import NodeOffer, NotSupportedError, ProviderContext
from services.shared.nodes import NodeRecords
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.capacity.local")

# Claims standby nodes for one request, atomically: two requests (two pools, two executor
# instances) never get the same node. A node already in use, or enrolled in the cluster by
# someone else (a fleet node with the same name), is skipped. Claimed nodes are enrolled here,
# before any agent starts. A request id seen before answers its recorded outcome instead.
# KEYS: request record, cluster's in-use hash, pool's provider nodes, cluster registry.
# ARGV: pool, record TTL (s), then (node, node record JSON) pairs.
CLAIM = """
local prior = redis.call('GET', KEYS[1])
if prior then return {'repeat', prior} end
local claimed = {}
for i = 3, #ARGV, 2 do
  local node = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], node) == 0 and redis.call('SISMEMBER', KEYS[4], node) == 0
  then
    redis.call('HSET', KEYS[2], node, ARGV[1])
    redis.call('HSET', KEYS[3], node, ARGV[i + 1])
    redis.call('SADD', KEYS[4], node)
    claimed[#claimed + 1] = node
  end
end
local record = cjson.encode({op = 'acquire', pool = ARGV[1], state = 'starting',
  nodes = table.concat(claimed, ',')})
redis.call('SET', KEYS[1], record, 'EX', ARGV[2])
return {'new', record}
"""

Starter = Callable[..., fleet.AgentProcess]
Stopper = Callable[..., bool]
Restarter = Callable[..., fleet.AgentProcess | None]


class LocalProvider:
    """Standby nodes as local `python -m agent` processes (no jobs until some move in)."""

    name = "local"

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        standby_nodes: Sequence[tuple[str, int]],
        *,
        state_dir: Path,
        namespace: str,
        env: Mapping[str, str],
        trusted_keys: Sequence[Path],
        interval_s: float = 2.0,
        jobs: str = "",
        stop_timeout_s: float = 15.0,
        record_ttl_s: int = 7 * 86_400,
        start: Starter = fleet.start_agent,
        stop: Stopper = fleet.stop_agent,
        restart: Restarter = fleet.restart_agent,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.standby_nodes = dict(standby_nodes)
        self.state_dir = state_dir
        self.namespace = namespace
        self.env = dict(env)
        self.trusted_keys = list(trusted_keys)
        self.interval_s = interval_s
        self.jobs = jobs
        self.stop_timeout_s = stop_timeout_s
        self.record_ttl_s = record_ttl_s
        self._start = start
        self._stop = stop
        self._restart = restart
        self._claim = redis.register_script(CLAIM)
        self.nodes = NodeRecords(redis, keys)

    @classmethod
    def from_context(cls, context: ProviderContext) -> LocalProvider:
        settings = context.settings
        state_dir = Path(settings.local_state_dir or context.state_dir).resolve()
        return cls(
            context.redis, context.keys, settings.standby_nodes(), state_dir=state_dir,
            namespace=context.namespace, env=context.env, trusted_keys=context.trusted_keys,
            interval_s=settings.local_interval_s, jobs=settings.local_jobs,
            stop_timeout_s=settings.local_stop_timeout_s, record_ttl_s=settings.result_ttl_s,
        )

    def in_use_key(self, cluster: str) -> str:
        """HASH standby node -> the pool it serves, for every pool of the cluster."""
        return self.keys.capacity_used(cluster)

    async def standby(self, cluster: str, pool: str) -> list[NodeOffer]:
        names = list(self.standby_nodes)
        if not names:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hkeys(self.in_use_key(cluster))
            pipe.smismember(self.keys.registry(cluster), names)
            in_use, enrolled = await pipe.execute()
        busy = {text(n) for n in in_use}
        return [NodeOffer(name, self.standby_nodes[name])
                for name, known in zip(names, enrolled, strict=True)
                if name not in busy and not known]

    async def acquire(self, cluster: str, pool: str, node_ids: list[str],
                      request_id: str) -> list[str]:
        unknown = [n for n in node_ids if n not in self.standby_nodes]
        if unknown:
            raise ValueError(f"not standby nodes of this provider: {unknown}")
        args: list[str | int] = [pool, self.record_ttl_s]
        for node in node_ids:
            args += [node, json.dumps({"gpus": self.standby_nodes[node], "pool": pool,
                                       "request_id": request_id})]
        outcome, raw = await self._claim(
            keys=[self.keys.capacity_request(request_id), self.in_use_key(cluster),
                  self.keys.capacity_nodes(cluster, pool), self.keys.registry(cluster)],
            args=args,
        )
        record: dict[str, Any] = json.loads(text(raw))
        claimed = [n for n in str(record.get("nodes", "")).split(",") if n]
        if text(outcome) == "repeat" and record.get("state") == "done":
            return claimed  # a repeated request: the nodes are already there
        # New, or a repeat of one interrupted before it was done: starting is idempotent
        # per node (a running agent is left alone), so finishing the job is safe.
        try:
            for node in claimed:
                await asyncio.to_thread(
                    self._start, node, gpus=self.standby_nodes[node], cluster_id=cluster,
                    namespace=self.namespace, state_dir=self.state_dir, env=self.env,
                    trusted_keys=self.trusted_keys, interval_s=self.interval_s, pool=pool,
                    jobs=self.jobs,
                )
        except Exception:
            # Hand the claim back, so a later request can try these nodes again.
            log.exception("starting standby nodes %s failed; releasing the claim", claimed)
            for node in claimed:
                await asyncio.to_thread(self._stop, self.state_dir, node, self.stop_timeout_s)
            await self._unclaim(cluster, pool, claimed)
            await self.redis.delete(self.keys.capacity_request(request_id))
            raise
        record["state"] = "done"
        await self.redis.set(self.keys.capacity_request(request_id), json.dumps(record),
                             ex=self.record_ttl_s)
        if claimed:
            log.info("added standby nodes %s to %s/%s (request %s)", claimed, cluster, pool,
                     request_id)
        return claimed

    async def release(self, cluster: str, node_id: str, request_id: str) -> bool:
        request = self.keys.capacity_request(request_id)
        prior = await self.redis.get(request)
        if prior is not None:
            return bool(json.loads(text(prior)).get("released", False))
        pool_raw = await self.redis.hget(self.in_use_key(cluster), node_id)
        if pool_raw is None:
            released = False  # not ours: a fleet node stays drained, nothing here stops it
        else:
            await asyncio.to_thread(self._stop, self.state_dir, node_id, self.stop_timeout_s)
            # Stopped first, then unenrolled: its last reports still count until it is gone,
            # and any later one (in flight) is quarantined as from an unknown node.
            await self._unclaim(cluster, text(pool_raw), [node_id])
            await self.nodes.forget(cluster, node_id)
            released = True
            log.info("released standby node %s of %s/%s (request %s)", node_id, cluster,
                     text(pool_raw), request_id)
        await self.redis.set(request, json.dumps({"op": "release", "node": node_id,
                                                  "released": released}),
                             ex=self.record_ttl_s)
        return released

    async def restart_agent(self, cluster: str, node_id: str, request_id: str) -> None:
        """Start the node's agent again from its state directory (its launch record): any
        agent this machine's fleet started, standby or not."""
        request = self.keys.capacity_request(request_id)
        if await self.redis.get(request) is not None:
            return  # this request restarted it already: a re-run starts nothing twice
        started = await asyncio.to_thread(self._restart, self.state_dir, node_id, self.env,
                                          self.stop_timeout_s)
        if started is None:
            raise NotSupportedError(
                f"node {node_id} was not started from {self.state_dir} (no launch record): "
                "the local provider cannot restart its agent")
        await self.redis.set(request, json.dumps({"op": "restart_agent", "node": node_id,
                                                  "cluster": cluster, "pid": started.pid}),
                             ex=self.record_ttl_s)
        log.info("restarted the agent of %s/%s as pid %d (request %s)", cluster, node_id,
                 started.pid, request_id)

    async def owned(self, cluster: str, pool: str) -> list[str]:
        return sorted(text(n) for n in await self.redis.hkeys(
            self.keys.capacity_nodes(cluster, pool)))

    async def _unclaim(self, cluster: str, pool: str, nodes: list[str]) -> None:
        if not nodes:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.keys.registry(cluster), *nodes)
            pipe.hdel(self.in_use_key(cluster), *nodes)
            pipe.hdel(self.keys.capacity_nodes(cluster, pool), *nodes)
            await pipe.execute()
