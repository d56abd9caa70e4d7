"""Queued demand: work waiting for capacity, per pool, from every place that queues it.

Each source reports its own entry for a pool (how many items wait, and how many GPUs they
would take), with a time after which the entry no longer counts, so a source that stops
reporting stops counting. The analyzer adds the live entries up every pool period, as a share
of the pool's up GPUs (`Keys.demand`, what the executor and the console read), beside the
number of items queued (scale-in waits while any is).

Sources:

* `ml_tasks`: ML tasks the router could not give to any model yet (waiting), reported by
  the router.
* `ops_tasks`: ops tasks the scheduler has queued and not dispatched, read from its queue
  by the analyzer (items only: an ops task is not GPU work, but capacity must not be
  removed under it).
* `pending_jobs`: jobs the orchestrator has admitted and not placed, reported by the
  inventory service (services/inventory) from each non-local cluster's backend
  (`Backend.queued_demand`: on Kubernetes the pending GPU pods, net of the GPUs on their way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from services.shared.redis_client import Keys, text

ML_TASKS: Final = "ml_tasks"
OPS_TASKS: Final = "ops_tasks"
PENDING_JOBS: Final = "pending_jobs"
MAX_DEMAND_PCT: Final = 1e6  # the contract's bound on demand_pct


class DemandEntry(BaseModel):
    """One source's queued work in one pool, and until when the figure counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: int = Field(ge=0, description="Items waiting (tasks, jobs).")
    gpus: float = Field(ge=0.0, description="GPUs the waiting items would take.")
    until: float = Field(description="Epoch seconds after which the entry no longer counts.")


class Demand(BaseModel):
    """A pool's queued work, all live sources together."""

    model_config = ConfigDict(frozen=True)

    items: int = 0
    gpus: float = 0.0
    by_source: dict[str, int] = Field(default_factory=dict)

    def pct_of(self, capacity_gpus: float) -> float:
        """The waiting GPUs as a share of the pool's up GPUs, % (at least one GPU assumed:
        work queued in a pool with nothing up is all demand)."""
        return min(100.0 * self.gpus / max(capacity_gpus, 1.0), MAX_DEMAND_PCT)

    def describe(self) -> str:
        """What is queued, by source, e.g. "3 ml_tasks, 1 ops_tasks"."""
        return ", ".join(f"{n} {source}" for source, n in sorted(self.by_source.items()) if n)


def total(entries: Mapping[str, DemandEntry], now: float,
          extra: Iterable[tuple[str, int, float]] = ()) -> Demand:
    """The live entries (and `extra` (source, items, gpus) figures) added up."""
    items, gpus = 0, 0.0
    by_source: dict[str, int] = {}
    live = [(s, e.items, e.gpus) for s, e in entries.items() if e.until >= now]
    for source, n, g in [*live, *extra]:
        items += n
        gpus += g
        by_source[source] = by_source.get(source, 0) + n
    return Demand(items=items, gpus=gpus, by_source=by_source)


def parse_entries(raw: Mapping[bytes | str, bytes | str]) -> dict[str, DemandEntry]:
    """A pool's demand hash as entries (an unreadable entry is left out)."""
    entries = {}
    for source, value in raw.items():
        try:
            entries[text(source)] = DemandEntry.model_validate_json(value)
        except ValueError:
            continue
    return entries


async def report_demand(redis: Redis, keys: Keys, cluster: str, pool: str, source: str, *,
                        items: int, gpus: float, now: float, ttl_s: float) -> None:
    """Set `source`'s queued work in a pool, counting for `ttl_s` unless reported again."""
    entry = DemandEntry(items=items, gpus=gpus, until=now + ttl_s)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(keys.demand_sources(cluster, pool), source, entry.model_dump_json())
        pipe.expire(keys.demand_sources(cluster, pool), max(int(ttl_s * 10), 60))
        await pipe.execute()
