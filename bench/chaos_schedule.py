"""The long randomized fault schedule: the chaos test of `make test`
(tests/chaos/test_random_schedule.py, one fixed 45 s schedule) run for minutes, each run under a
seed of its own, printing every seed and whether its history broke an invariant.

Run: `python -m bench.chaos_schedule [--runs 3] [--seconds 300] [--seed N]` with the servers up
(`make up`, `source deploy/local/env.sh`); a failing run prints the seed to repeat it with
(`CHAOS_SEED=<seed> CHAOS_SCHEDULE_S=<s> pytest tests/chaos/test_random_schedule.py`).
`--quick` is one 45 s run.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/chaos/test_random_schedule.py"


def one_run(seed: int, seconds: float) -> tuple[bool, float, str]:
    """(passed, wall seconds, the test's last lines) of one schedule."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", TEST],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "CHAOS_SEED": str(seed), "CHAOS_SCHEDULE_S": f"{seconds:g}"})
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    return done.returncode == 0, time.monotonic() - started, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="how long each schedule throws faults")
    parser.add_argument("--seed", type=int, default=None, help="the first run's seed")
    parser.add_argument("--quick", action="store_true", help="one 45 s run")
    args = parser.parse_args()
    runs, seconds = (1, 45.0) if args.quick else (args.runs, args.seconds)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    failed = 0
    print(f"chaos schedule: {runs} run(s) of {seconds:g} s")
    for seed in range(first, first + runs):
        passed, took, tail = one_run(seed, seconds)
        print(f"seed {seed}: {'held' if passed else 'BROKEN'} ({took:.0f} s)")
        if not passed:
            failed += 1
            print(tail)
    print(f"{runs - failed} of {runs} schedule(s) broke no invariant")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
