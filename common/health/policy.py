"""What a health probe answers, decided from what the process knows of itself (pure).

Liveness and readiness fail for different reasons on purpose: liveness only for what a restart
cures (a background loop or a consumer that ended for good; a stuck event loop cannot answer at
all), readiness for what a restart does not (start-up still running, the broker, Redis or the
database not answering), so an outage of a dependency never restarts every service at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

OK: Final = 200
UNAVAILABLE: Final = 503
# A reason is a line for a person and a probe log; a long exception text is cut.
MAX_DETAIL_CHARS: Final = 200


class Phase(StrEnum):
    """Where the process is in its life: checks run only while it runs."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"


@dataclass(frozen=True)
class CheckResult:
    """One dependency's answer to a bounded check: ok, or what went wrong."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Answer:
    """An endpoint's status code and JSON body."""

    status: int
    body: dict[str, object]


def checks_to_run(phase: Phase, dependencies: Sequence[str]) -> list[str]:
    """The dependencies to ask now: none unless the process runs (before start-up has finished
    the answer is "starting" whatever they say, and a stopping process is no longer ready)."""
    return list(dependencies) if phase is Phase.RUNNING else []


def liveness(phase: Phase, ended: Sequence[str]) -> Answer:
    """503 naming the background loops and consumers that ended while the process runs; 200
    otherwise (before start-up has finished nothing has begun, and a stopping process ends its
    loops itself)."""
    if phase is Phase.RUNNING and ended:
        return Answer(UNAVAILABLE, {"status": "dead",
                                    "reason": _cut("ended: " + ", ".join(ended)),
                                    "ended": list(ended)})
    return Answer(OK, {"status": "ok"})


def readiness(phase: Phase, results: Sequence[CheckResult]) -> Answer:
    """200 once start-up has finished and while every dependency answered; 503 otherwise,
    naming the phase or the failed checks."""
    if phase is Phase.STARTING:
        return Answer(UNAVAILABLE, {"status": "starting", "reason": "start-up not finished"})
    if phase is Phase.STOPPING:
        return Answer(UNAVAILABLE, {"status": "stopping", "reason": "shutting down"})
    checks = {r.name: "ok" if r.ok else _cut(r.detail or "failed") for r in results}
    failed = [r for r in results if not r.ok]
    if failed:
        reason = "; ".join(f"{r.name}: {checks[r.name]}" for r in failed)
        return Answer(UNAVAILABLE, {"status": "unready", "reason": _cut(reason),
                                    "failed": [r.name for r in failed], "checks": checks})
    return Answer(OK, {"status": "ready", "checks": checks})


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS - 3] + "..."
