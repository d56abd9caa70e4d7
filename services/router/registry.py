"""The model registry: which nodes serve which model versions, fed by the agents' reports.

Each node's latest report that lists models is kept as one field of a Redis hash per cluster
(node -> JSON); a report older than the one kept is ignored (per-node seq, checked in one
script), so replaying the reports topic from the start never rolls the registry back. A
report without models removes the node's field. Freshness is judged on the report's own
time: a node silent for three of its intervals (at least `stale_after_s`) serves nothing
ready, and one silent for `forget_after_s` leaves the registry.

`candidates` turns the registry into the selector's candidates for one task type: a model
version is `<name>:<version>` there, its predecessor the next lower version of the same name
served anywhere, its fallback group the rank of its family in the configured order.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from policy.selector import Candidate
from schemas.events.v1 import NodeMode, NodeReport, ServedModel
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.router.registry")
MODEL_SEP = ":"

# KEYS: registry hash, seq hash, the cluster's enrolled nodes. ARGV: node, seq, entry JSON
# ('' removes the node), '1' if only enrolled nodes may serve.
_UPDATE = """
if ARGV[4] == '1' and redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 0 then return -1 end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1')
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
"""


class NodeModels(BaseModel):
    """One node's entry: the models of its latest report, and when that report was made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    seq: int
    at: float = Field(description="The report's time, epoch seconds.")
    interval_s: Annotated[float, Field(gt=0.0)]
    mode: NodeMode
    models: list[ServedModel]

    def fresh(self, now: float, stale_after_s: float) -> bool:
        return now - self.at <= max(stale_after_s, 3.0 * self.interval_s)


def policy_model(name: str, version: str) -> str:
    """A model version as the selector names it."""
    return f"{name}{MODEL_SEP}{version}"


def split_model(model: str) -> tuple[str, str]:
    """(name, version) of a selector model name."""
    name, _, version = model.rpartition(MODEL_SEP)
    return name, version


def _version_key(version: str) -> tuple[int, int | str]:
    # Numeric versions compare as numbers (10 after 9); others as text, after the numbers.
    return (0, int(version)) if version.isdigit() else (1, version)


def candidates(entries: Sequence[NodeModels], task_type: str, now: float,
               fallbacks: Mapping[str, Sequence[str]], stale_after_s: float) -> list[Candidate]:
    """The selector's candidates for `task_type`: every model version on every node.

    Loading or failed models, models of draining or offline nodes and of nodes whose
    report is stale are candidates that are not ready (the decision shows them, and why).
    """
    order = list(fallbacks.get(task_type, ()))
    served = [(entry, m) for entry in entries for m in entry.models if m.task_type == task_type]
    versions: dict[str, set[str]] = {}
    for _, m in served:
        versions.setdefault(m.model, set()).add(m.version)
    found: list[Candidate] = []
    for entry, m in served:
        older = sorted((v for v in versions[m.model]
                        if _version_key(v) < _version_key(m.version)), key=_version_key)
        group = order.index(m.family) if m.family in order else len(order)
        ready = (m.state == "ready" and entry.mode == "active"
                 and entry.fresh(now, stale_after_s))
        found.append(Candidate(
            model=policy_model(m.model, m.version), node=entry.node, family=m.family,
            group=group, ready=ready,
            predecessor=policy_model(m.model, older[-1]) if older else None,
            max_ongoing=m.max_concurrency))
    return found


@dataclass
class _Cached:
    at: float
    entries: list[NodeModels]


class Registry:
    """The registry in Redis: written from reports, read (briefly cached) for decisions."""

    def __init__(self, redis: Redis, keys: Keys, *, cache_s: float = 0.5,
                 forget_after_s: float = 600.0, require_registration: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self.keys = keys
        self.cache_s = cache_s
        self.forget_after_s = forget_after_s
        self.require_registration = require_registration
        self.clock = clock
        self._script = redis.register_script(_UPDATE)
        self._cache: dict[str, _Cached] = {}

    async def update(self, report: NodeReport) -> bool:
        """Keep `report`'s models as its node's entry; False if a newer report is kept, or the
        node is not enrolled in its cluster (the collector quarantines its reports too: a
        node nobody enrolled must not receive tasks)."""
        entry = ""
        if report.models:
            entry = NodeModels(node=report.node_id, seq=report.seq,
                               at=report.occurred_at.timestamp(), interval_s=report.interval_s,
                               mode=report.mode, models=list(report.models)).model_dump_json()
        cluster = report.cluster_id
        changed = int(await self._script(
            keys=[self.keys.ml_registry(cluster), self.keys.ml_registry_seq(cluster),
                  self.keys.registry(cluster)],
            args=[report.node_id, report.seq, entry, "1" if self.require_registration else "0"]))
        if changed == -1:
            log.debug("models of %s/%s ignored: the node is not enrolled", cluster,
                      report.node_id)
        if changed == 1:
            self._cache.pop(cluster, None)
        return changed == 1

    async def entries(self, cluster: str, now: float) -> list[NodeModels]:
        """Every node's entry (nodes silent for `forget_after_s` are removed)."""
        cached = self._cache.get(cluster)
        if cached is not None and self.clock() - cached.at <= self.cache_s:
            return cached.entries
        raw = await self.redis.hgetall(self.keys.ml_registry(cluster))
        entries: list[NodeModels] = []
        forgotten: list[str] = []
        for node, body in raw.items():
            entry = NodeModels.model_validate_json(body)
            if now - entry.at > self.forget_after_s:
                forgotten.append(text(node))
            else:
                entries.append(entry)
        if forgotten:
            await self.redis.hdel(self.keys.ml_registry(cluster), *forgotten)
        entries.sort(key=lambda e: e.node)
        self._cache[cluster] = _Cached(self.clock(), entries)
        return entries


def bounded(found: Sequence[Candidate], limit: int, rng: random.Random) -> list[Candidate]:
    """At most `limit` candidates for one decision (its event must stay small).

    Ready ones first, earlier fallback groups first; within the group that does not fit
    whole, a random sample (Envoy's least-request looks at two random hosts; this looks at
    `limit`). The decision records the candidates it was given, so it replays all the same.
    """
    if len(found) <= limit:
        return list(found)
    ready = sorted((c for c in found if c.ready), key=lambda c: (c.group, c.arm))
    chosen: list[Candidate] = []
    for group in sorted({c.group for c in ready}):
        members = [c for c in ready if c.group == group]
        room = limit - len(chosen)
        if room <= 0:
            break
        chosen += members if len(members) <= room else rng.sample(members, room)
    rest = sorted((c for c in found if not c.ready), key=lambda c: (c.group, c.arm))
    chosen += rest[: max(limit - len(chosen), 0)]
    return sorted(chosen, key=lambda c: (c.group, c.model, c.node))
