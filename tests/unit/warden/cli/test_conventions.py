"""`warden`'s conventions for scripts: `--version`, `warden events --json`, and an exit code
for each way a command ends (pure: the API's answers are made by the test)."""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Any
from uuid import uuid4

import httpx
import pytest
import typer
from typer.testing import CliRunner

from common.settings import ServiceSettings
from schemas.catalog import TOPIC_MODELS
from schemas.topics import Topic
from services.api.client import ApiClient
from tests.contracts.examples import examples
from tests.unit.warden.cli.test_events import GOLDEN_OF
from warden.cli import app, common, events, ml, tasks


def test_version_prints_the_installed_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == common.EXIT_OK
    assert result.output == f"warden {version('clusterwarden')}\n"


def test_the_exit_codes_are_distinct_and_in_the_help() -> None:
    codes = [common.EXIT_OK, common.EXIT_FAILED, common.EXIT_USAGE, common.EXIT_WAIT_TIMEOUT]
    assert len(set(codes)) == len(codes)
    # Our checks raise typer.BadParameter: it ends a command as Click's own usage errors do.
    assert typer.BadParameter.exit_code == common.EXIT_USAGE
    assert "3 --wait timed out" in CliRunner().invoke(app, ["--help"]).output


def test_a_usage_error_found_in_a_command_s_body_exits_2() -> None:
    # Checked after the options were parsed, before any call of the API.
    result = CliRunner().invoke(app, ["submit", "--digit", "3", "--input", "1,2"])
    assert result.exit_code == common.EXIT_USAGE
    assert "give exactly one of --digit and --input" in result.output


def never_settling(state: str) -> ApiClient:
    """A client of an API whose task stays in `state`."""
    task: dict[str, Any] = {"task_id": str(uuid4()), "state": state, "transitions": [],
                            "attempt_list": []}
    http = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, json=task)),
                        base_url="http://api.test")
    return ApiClient(http=http)


def test_a_wait_that_times_out_exits_3() -> None:
    with pytest.raises(typer.Exit) as caught:
        tasks.follow(never_settling("running"), uuid4(), lambda _: False, timeout_s=0.0,
                     poll_s=0.0)
    assert caught.value.exit_code == common.EXIT_WAIT_TIMEOUT
    with pytest.raises(typer.Exit) as caught:
        ml.follow_ml(never_settling("routed"), uuid4(), timeout_s=0.0, poll_s=0.0, quiet=True)
    assert caught.value.exit_code == common.EXIT_WAIT_TIMEOUT


@pytest.mark.parametrize("topic", events.WATCHED)
def test_an_event_as_json_is_its_topic_and_the_event_as_its_model_dumps_it(
        topic: Topic) -> None:
    event = examples()[GOLDEN_OF[topic][0]]
    line = events.json_line(topic, event.model_dump_json().encode())
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed == {"topic": topic.value, "event": event.model_dump(mode="json")}
    assert TOPIC_MODELS[topic].model_validate_json(json.dumps(parsed["event"])) == event


def test_events_json_prints_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    event = examples()["node_state"]

    async def one_event(settings: ServiceSettings, as_json: bool = False) -> int:
        render = events.json_line if as_json else events.describe
        typer.echo(render(Topic.OPS_NODE_STATE, event.model_dump_json().encode()))
        return 0

    monkeypatch.setattr(events, "watch", one_event)
    result = CliRunner().invoke(app, ["events", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["event"]["event_id"] == str(event.event_id)
    human = CliRunner().invoke(app, ["events"])
    assert human.output == events.describe(Topic.OPS_NODE_STATE,
                                           event.model_dump_json().encode()) + "\n"
