"""`warden submit` and `warden ml list|show|models` against the real API (in process)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from schemas.events.v1 import NodeReport
from services.router.registry import Registry
from services.store.ml import MlRecorder
from tests.contracts.examples import example
from tests.service.warden.cli.conftest import Cli
from tests.unit.store.test_ml_records import story


def record(cli: Cli, start_s: float = 0.0, succeed: bool = True) -> str:
    events = story(start_s=start_s, succeed=succeed)

    async def run() -> None:
        recorder = MlRecorder(cli.runtime.store)
        for event in events:
            await recorder.record(event)

    cli.server.call(run)
    return str(events[0].task_id)


def test_ml_list_and_show(warden: Cli) -> None:
    done = record(warden)
    failed = record(warden, start_s=10.0, succeed=False)
    result = warden.run("ml", "list", role="viewer")
    assert result.exit_code == 0, result.output
    header, first, second = result.output.splitlines()
    assert header.split() == ["TASK", "STATE", "TYPE", "MODEL", "NODE", "TRIES", "ANSWER",
                              "CAUSE", "CREATED"]
    assert failed in first
    assert "node_fault" in first
    assert done in second
    assert "digits-knn:1" in second
    page = json.loads(warden.run("ml", "list", "--state", "succeeded", "--json").output)
    assert [t["task_id"] for t in page["items"]] == [done]

    shown = warden.run("ml", "show", done, "--candidates")
    assert shown.exit_code == 0, shown.output
    for part in ("state     succeeded",
                 "attempt 1: digits-mlp:2 on node-002 [selected] -> failed: model_fault",
                 "attempt 2: digits-knn:1 on node-003 [selected] -> 0", "quarantined until"):
        assert part in shown.output


def test_ml_models_shows_the_registry(warden: Cli) -> None:
    report = example("node_report", NodeReport)
    fresh = report.model_copy(update={"cluster_id": "c1", "occurred_at": datetime.now(UTC)})
    registry = Registry(warden.runtime.redis, warden.runtime.keys, require_registration=False)
    warden.server.call(registry.update, fresh)
    result = warden.run("ml", "models", role="viewer")
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()
    assert header.split()[:4] == ["NODE", "TYPE", "MODEL", "FAMILY"]
    assert row.split()[:7] == ["node-002", "digits", "digits-mlp:2", "mlp", "ready", "yes",
                               "closed"]


def test_submit_needs_exactly_one_input(warden: Cli) -> None:
    for args in ((), ("--digit", "1", "--input", "1,2")):
        result = warden.run("submit", *args, role="operator")
        assert result.exit_code == 2, result.output
    result = warden.run("submit", "--input", "1,two", role="operator")
    assert result.exit_code == 2


@pytest.mark.usefixtures("kafka_bootstrap")
def test_submit_publishes_a_held_out_digit(warden: Cli) -> None:
    result = warden.run("submit", "--digit", "3", "--deadline", "5", role="operator")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("submitted ML task ")
    refused = warden.run("submit", "--digit", "3", role="viewer")
    assert refused.exit_code == 1
    assert "403" in refused.output
