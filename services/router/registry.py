"""The model registry: which nodes serve which model versions, fed by the agents' reports.

Each node's latest report that lists models is kept as one field of a Redis hash per cluster
(node -> JSON); a report older than the one kept is ignored (per-node seq, checked in one
script call per batch of reports), so replaying the reports topic from the start never
rolls the registry back. A report without models removes the node's field. Freshness is
judged on the report's own time: a node silent for three of its intervals (at least
`stale_after_s`) serves nothing ready, and one silent for `forget_after_s` leaves the
registry.

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
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from schemas.events.v1 import NodeMode, NodeReport, ServedModel
from services.router.policy.selector import Candidate
from services.router.policy.stats import arm_key
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.router.registry")
MODEL_SEP = ":"

# Applies a batch of reports in one call (one round trip per batch, not per report: the
# control plane keeps up with thousands of reports a second). KEYS: per cluster of the
# batch, its registry hash, seq hash and enrolled nodes. ARGV[1]: '1' if only enrolled nodes
# may serve; then per cluster, how many of its reports follow, then node, seq and entry JSON
# ('' removes the node) of each, in the order they were consumed. Answers one code per
# report, in that order: 1 kept, 0 not newer than the kept one, -1 node not enrolled.
_APPLY = """
local strict = ARGV[1] == '1'
local out = {}
local a = 2
for c = 0, #KEYS / 3 - 1 do
  local registry, seqs, enrolled = KEYS[3 * c + 1], KEYS[3 * c + 2], KEYS[3 * c + 3]
  local n = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, n do
    local node, seq, entry = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    a = a + 3
    if strict and redis.call('SISMEMBER', enrolled, node) == 0 then
      out[#out + 1] = -1
    elseif tonumber(seq) <= tonumber(redis.call('HGET', seqs, node) or '-1') then
      out[#out + 1] = 0
    else
      redis.call('HSET', seqs, node, seq)
      if entry == '' then
        redis.call('HDEL', registry, node)
      else
        redis.call('HSET', registry, node, entry)
      end
      out[#out + 1] = 1
    end
  end
end
return out
"""
Applied = Literal["kept", "old", "unknown"]
_APPLIED: dict[int, Applied] = {1: "kept", 0: "old", -1: "unknown"}


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


def _entry(report: NodeReport) -> str:
    """The registry's JSON entry of a report ('' for a report without models)."""
    if not report.models:
        return ""
    return NodeModels(node=report.node_id, seq=report.seq, at=report.occurred_at.timestamp(),
                      interval_s=report.interval_s, mode=report.mode,
                      models=list(report.models)).model_dump_json()


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


def served_arms(entries: Sequence[NodeModels]) -> list[str]:
    """The arm key of every model version on every node of `entries` (any task type, any
    state): the arms a change point on one of their models or nodes concerns."""
    return sorted({arm_key(policy_model(m.model, m.version), entry.node)
                   for entry in entries for m in entry.models})


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
        self._script = redis.register_script(_APPLY)
        self._cache: dict[str, _Cached] = {}

    async def update(self, report: NodeReport) -> bool:
        """Keep `report`'s models as its node's entry; False if a newer report is kept, or the
        node is not enrolled in its cluster (the collector quarantines its reports too: a
        node nobody enrolled must not receive tasks)."""
        return (await self.apply([report]))[0] == "kept"

    async def apply(self, reports: Sequence[NodeReport]) -> list[Applied]:
        """`update` for a batch, in one round trip: what became of each report, in order.

        Reports are applied in their order (per node, a later report with an older seq
        is `old`, as it would be one by one); only `kept` ones changed the registry.
        """
        if not reports:
            return []
        by_cluster: dict[str, list[int]] = {}
        for i, report in enumerate(reports):
            by_cluster.setdefault(report.cluster_id, []).append(i)
        keys: list[str] = []
        args: list[str | int] = ["1" if self.require_registration else "0"]
        order: list[int] = []
        for cluster, indices in by_cluster.items():
            keys += [self.keys.ml_registry(cluster), self.keys.ml_registry_seq(cluster),
                     self.keys.registry(cluster)]
            args.append(len(indices))
            for i in indices:
                report = reports[i]
                args += [report.node_id, report.seq, _entry(report)]
            order += indices
        codes = await self._script(keys=keys, args=args)
        applied: list[Applied] = ["old"] * len(reports)
        for i, code in zip(order, codes, strict=True):
            applied[i] = _APPLIED[int(code)]
        for cluster, indices in by_cluster.items():
            if any(applied[i] == "kept" for i in indices):
                self._cache.pop(cluster, None)
            for i in indices:
                if applied[i] == "unknown":
                    log.debug("models of %s/%s ignored: the node is not enrolled", cluster,
                              reports[i].node_id)
        return applied

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
