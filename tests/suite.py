"""The suite's kinds of test, and the check that a complete run really ran all of them.

Every test is sorted by what it needs, from its fixtures and folder, never by hand:

- ``unit``: pure code, no service and no browser (`make unit` runs only these);
- ``service``: one part against a real redis-server, Kafka broker or PostgreSQL;
- ``integration``: services started as processes, talking through the real broker
  (everything under ``tests/integration/`` and ``tests/chaos/``, the fault scenarios);
- ``browser``: an integration test that drives Debian's chromium (the ``chromium`` fixture).

Each kind is also a marker (``-m "not service"``), and a test needing a particular server
carries ``kafka``, ``redis``, ``postgres``, ``alertmanager`` or ``kubernetes``. The summary
prints a line per kind.

``--complete`` (which `make test`, and so CI, passes) fails the run when a kind ran no test,
or when any test was skipped or xfailed without a reason listed in ``REVIEWED_SKIPS``: a
missing service or browser must show up as a red run, never as a green one with parts left
out. The fixtures that reach a service fail, not skip, when it is missing (tests/conftest.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

KINDS = ("unit", "service", "integration", "browser")
SERVERS = {"kafka_bootstrap": "kafka", "redis_url": "redis", "private_redis": "redis",
           "alertmanager_url": "alertmanager", "kube_api": "kubernetes"}

# Skips a reviewer has accepted: the start of the skip's reason -> why it is acceptable.
# A complete run fails on any skip (or xfail) whose reason starts with none of these.
REVIEWED_SKIPS: dict[str, str] = {}


def needs_of(item: pytest.Item) -> set[str]:
    """The servers a test reaches, from the fixtures it uses (directly or through others)."""
    names = set(getattr(item, "fixturenames", ()))
    needs = {server for fixture, server in SERVERS.items() if fixture in names}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("database_url") == "postgresql":
        needs.add("postgres")
    return needs


INTEGRATION_TREES = (("tests", "integration"), ("tests", "chaos"))


def in_integration_tree(path: Path) -> bool:
    """Under a tests/integration or tests/chaos folder (this suite's, or one a test of this
    plugin makes)."""
    parts = path.parts
    return any(parts[i:i + 2] in INTEGRATION_TREES for i in range(len(parts) - 1))


def kinds_of(item: pytest.Item) -> set[str]:
    kinds: set[str] = set()
    if in_integration_tree(item.path):
        kinds.add("integration")
        if "chromium" in getattr(item, "fixturenames", ()):
            kinds.add("browser")
    elif needs_of(item):
        kinds.add("service")
    else:
        kinds.add("unit")
    return kinds


def reviewed(reason: str) -> bool:
    return any(reason.startswith(prefix) for prefix in REVIEWED_SKIPS)


@dataclass
class Tally:
    """What happened to each test, by kind, as the run reports it."""

    kinds: dict[str, set[str]] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    unreviewed: list[tuple[str, str]] = field(default_factory=list)
    deselected: Counter[str] = field(default_factory=Counter)

    def record(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if report.skipped:
            reason = _skip_reason(report)
            self.outcomes[nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            if not reviewed(reason):
                self.unreviewed.append((nodeid, reason))
        elif report.failed:
            self.outcomes[nodeid] = "failed" if report.when == "call" else "error"
        elif report.when == "call":
            self.outcomes.setdefault(nodeid, "passed")

    def counts(self, kind: str) -> Counter[str]:
        return Counter(outcome for nodeid, outcome in self.outcomes.items()
                       if kind in self.kinds.get(nodeid, ()))

    def ran(self, kind: str) -> int:
        counts = self.counts(kind)
        return counts["passed"] + counts["failed"]


def _skip_reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--complete", action="store_true",
        help="fail unless every kind of test ran and nothing was skipped without a reviewed "
             "reason (make test passes it)")


def pytest_configure(config: pytest.Config) -> None:
    for kind, text in (
        ("unit", "pure code: no service, no browser"),
        ("service", "one part against a real redis-server, Kafka broker, PostgreSQL, "
                    "Alertmanager or Kubernetes API server"),
        ("integration", "services as processes talking through the real broker"),
        ("browser", "an integration test driving Debian's chromium"),
        ("kafka", "reaches the real Kafka broker"),
        ("redis", "reaches the real redis-server"),
        ("postgres", "reaches the real PostgreSQL"),
        ("alertmanager", "reaches the real Prometheus Alertmanager"),
        ("kubernetes", "reaches the real Kubernetes API server"),
    ):
        config.addinivalue_line("markers", f"{kind}: {text}")
    config.pluginmanager.register(KindsReport(config.getoption("--complete")), "kinds-report")


def incomplete(tally: Tally) -> list[str]:
    """Why a run that had to be complete was not (nothing: it was)."""
    problems = [f"no {kind} test ran" for kind in KINDS if tally.ran(kind) == 0]
    problems += [f"skipped without a reviewed reason: {nodeid} ({reason})"
                 for nodeid, reason in tally.unreviewed]
    return problems


class KindsReport:
    """Marks each test with its kinds, counts what ran, and judges a complete run."""

    def __init__(self, complete: bool) -> None:
        self.complete = complete
        self.tally = Tally()

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            kinds = kinds_of(item)
            self.tally.kinds[item.nodeid] = kinds
            for marker in sorted(kinds | needs_of(item)):
                item.add_marker(marker)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.tally.deselected.update(kinds_of(item))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tally.record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.complete and exitstatus in (0, 1) and incomplete(self.tally):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tally = self.tally
        if not tally.outcomes:
            return
        terminalreporter.section("tests by kind")
        for kind in KINDS:
            counts = tally.counts(kind)
            others = ", ".join(f"{counts[o]} {o}"
                               for o in ("failed", "error", "skipped", "xfailed") if counts[o])
            line = f"{kind + ':':13}{tally.ran(kind):5d} ran ({counts['passed']} passed"
            line += f", {others})" if others else ")"
            if tally.deselected[kind]:
                line += f"; {tally.deselected[kind]} left out"
            terminalreporter.write_line(line)
        if self.complete:
            for problem in incomplete(tally):
                terminalreporter.write_line(f"INCOMPLETE RUN: {problem}", red=True, bold=True)
