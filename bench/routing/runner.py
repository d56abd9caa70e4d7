"""Run every router on every (scenario, seed) and collect the per-run figures."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from bench.routing.metrics import run_metrics
from bench.routing.routers import BASELINES, Oracle, Production, RouterFactory
from bench.routing.sim import MAX_RETRIES, Sim, workload
from bench.routing.world import Scenario, scenarios
from services.router.policy.config import SelectorConfig

PRODUCTION = "selector"
ORACLE = "oracle"


# Selector settings by name, as given on the command line (JSON values, or the text itself);
# SelectorConfig validates them.
Overrides = dict[str, object]


@dataclass(frozen=True)
class Job:
    scenario: str
    seed: int
    policies: tuple[str, ...]
    variants: tuple[tuple[str, Overrides], ...]   # extra selector configs by name
    max_retries: int = MAX_RETRIES


def factories(variants: Iterable[tuple[str, Overrides]]) -> dict[str, RouterFactory]:
    out: dict[str, RouterFactory] = {PRODUCTION: lambda s, sim: Production(s)}
    out.update(BASELINES)
    for name, overrides in variants:
        config = SelectorConfig.model_validate(overrides)
        out[name] = _variant(config, name)
    return out


def _variant(config: SelectorConfig, name: str) -> RouterFactory:
    return lambda s, sim: Production(s, config, name)


def run_job(job: Job) -> tuple[str, int, dict[str, dict[str, float]]]:
    """Oracle first (its shares are the recovery references), then every policy."""
    sc = {s.name: s for s in scenarios()}[job.scenario]
    work = workload(sc, job.seed)
    oracle = Sim(sc, work, lambda s, sim: Oracle(s, sim), job.seed, job.max_retries).run()
    out = {ORACLE: run_metrics(oracle, oracle)}
    made = factories(job.variants)
    for name in job.policies:
        if name == ORACLE:
            continue
        # Each router gets its own RNG stream, derived from the seed (not shared state).
        sim = Sim(sc, work, made[name], job.seed * 7919 + 17, job.max_retries).run()
        out[name] = run_metrics(sim, oracle)
    return job.scenario, job.seed, out


def run_all(names: Sequence[str], seeds: Sequence[int], policies: Sequence[str],
            variants: Sequence[tuple[str, Overrides]] = (), processes: int = 2,
            max_retries: int = MAX_RETRIES,
            progress: Callable[[int, int], None] | None = None,
            ) -> dict[str, dict[str, list[dict[str, float]]]]:
    """results[scenario][policy] = per-seed metrics, in seed order."""
    jobs = [Job(n, s, tuple(policies), tuple(variants), max_retries)
            for n in names for s in seeds]
    results: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    done = 0

    def collect(item: tuple[str, int, dict[str, dict[str, float]]]) -> None:
        nonlocal done
        name, seed, per = item
        for policy, metrics in per.items():
            results.setdefault(name, {}).setdefault(policy, {})[seed] = metrics
        done += 1
        if progress:
            progress(done, len(jobs))

    if processes <= 1:
        for job in jobs:
            collect(run_job(job))
    else:
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ctx.Pool(processes) as pool:
            for item in pool.imap_unordered(run_job, jobs, chunksize=1):
                collect(item)
    return {n: {p: [by_seed[s] for s in sorted(by_seed)] for p, by_seed in per.items()}
            for n, per in results.items()}


def scenario_names() -> list[str]:
    return [s.name for s in scenarios()]


def scenario_by_name() -> dict[str, Scenario]:
    return {s.name: s for s in scenarios()}
