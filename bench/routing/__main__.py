"""`python -m bench.routing`: every router on every scenario, >= 30 seeds; table + JSON.

Reported seeds are 1000.. (default 30 of them); the selector's defaults were tuned on seeds
1..10 (`--seed-base 1 --seeds 10`), which are never reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import UTC, datetime

from bench.routing import micro
from bench.routing.report import markdown, summarise
from bench.routing.routers import BASELINES
from bench.routing.runner import (
    ORACLE,
    PRODUCTION,
    Overrides,
    run_all,
    scenario_by_name,
    scenario_names,
)
from bench.routing.sim import MAX_RETRIES
from services.router.policy.config import DEFAULT_CONFIG


def _parse_variant(text: str) -> tuple[str, Overrides]:
    """`name:key=value,key=value` -> a selector variant (values parsed as JSON if they can)."""
    name, _, body = text.partition(":")
    overrides: Overrides = {}
    for item in filter(None, body.split(",")):
        key, _, raw = item.partition("=")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    return f"{PRODUCTION}:{name}", overrides


def _clean(obj: object) -> object:
    if isinstance(obj, float):
        return None if math.isnan(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    all_policies = [PRODUCTION, *BASELINES, ORACLE]
    p = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    p.add_argument("--scenarios", nargs="*", default=scenario_names(),
                   choices=scenario_names())
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--seed-base", type=int, default=1000)
    p.add_argument("--policies", nargs="*", default=all_policies, choices=all_policies)
    p.add_argument("--variant", action="append", default=[],
                   help="extra selector config, e.g. slowdecay:half_life_s=300")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--retries", type=int, default=MAX_RETRIES,
                   help="harness retries per task (0: the no-retry variant)")
    p.add_argument("--json", default="", help="write the summary (and meta) here")
    p.add_argument("--json-runs", action="store_true",
                   help="with --json: also every per-seed figure (a few MB)")
    p.add_argument("--markdown", default="", help="write the tables here")
    p.add_argument("--no-micro", action="store_true", help="skip the 1 k-arm overhead check")
    args = p.parse_args(argv)

    variants = [_parse_variant(v) for v in args.variant]
    policies = list(args.policies) + [name for name, _ in variants]
    seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    started = time.time()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.time() - last[0] > 10 or done == total:
            last[0] = time.time()
            print(f"  {done}/{total} runs ({time.time() - started:.0f} s)", file=sys.stderr)

    print(f"routing benchmark: {len(args.scenarios)} scenarios x {len(seeds)} seeds "
          f"({seeds[0]}..{seeds[-1]}) x {len(policies)} policies + oracle, "
          f"{args.processes} processes", file=sys.stderr)
    results = run_all(args.scenarios, seeds, policies, variants, args.processes,
                      args.retries, progress)
    elapsed = time.time() - started
    summary = summarise(results)
    descriptions = {n: s.description for n, s in scenario_by_name().items()}
    table = markdown(summary, descriptions)
    overhead = None if args.no_micro else micro.measure()
    meta = {
        "command": "python -m bench.routing " + " ".join(argv if argv is not None
                                                         else sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "seeds": seeds, "scenarios": args.scenarios, "policies": policies,
        "variants": dict(variants), "retries": args.retries,
        "selector_config": DEFAULT_CONFIG.model_dump(), "elapsed_s": elapsed,
        "overhead_1k_arms": overhead,
    }
    print(table)
    if overhead:
        print("Decision overhead (1,000-arm snapshot): "
              + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in overhead.items()))
    print(f"elapsed {elapsed:.0f} s", file=sys.stderr)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            body: dict[str, object] = {"meta": meta, "summary": summary}
            if args.json_runs:
                body["runs"] = results
            json.dump(_clean(body), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
