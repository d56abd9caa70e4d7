"""The templater's handler: every need kind makes a task, announced by `created` first."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import yaml

from common.errors import PermanentError
from common.messaging import EventBus
from schemas.envelope import Envelope
from schemas.events.v1 import NeedKind, OpsNeed, OpsTask, TaskEvent
from schemas.topics import Topic
from services.templater.handlers import Templater
from services.templater.templates import load_templates
from tests.contracts.examples import example


class RecordingBus(EventBus):
    """Keeps what would have been published, in order."""

    def __init__(self) -> None:
        self.published: list[tuple[Topic, Envelope]] = []

    async def publish(self, topic: Topic, event: Envelope) -> None:
        self.published.append((topic, event))


def need(kind: NeedKind) -> OpsNeed:
    base = example("ops_need", OpsNeed)
    target = base.pool if kind in ("scale_out", "scale_in") else base.target
    return base.model_copy(update={"kind": kind, "target": target})


@pytest.mark.parametrize("kind", get_args(NeedKind))
async def test_every_need_kind_makes_a_task_created_first(kind: NeedKind) -> None:
    bus = RecordingBus()
    await Templater(load_templates(), bus, dry_run=False).on_need(need(kind))
    [(first_topic, created), (second_topic, task)] = bus.published
    assert (first_topic, second_topic) == (Topic.OPS_TASK_EVENTS, Topic.OPS_TASKS)
    assert isinstance(created, TaskEvent)
    assert isinstance(task, OpsTask)
    assert created.state == "created"
    assert created.task == task
    assert task.need_kind == kind
    assert task.correlation_id == str(need(kind).event_id)


async def test_dry_run_templater_makes_dry_run_tasks() -> None:
    bus = RecordingBus()
    await Templater(load_templates(), bus, dry_run=True).on_need(need("offline"))
    assert isinstance(task := bus.published[1][1], OpsTask)
    assert task.dry_run


async def test_a_need_without_a_template_is_dead_lettered(tmp_path: Path) -> None:
    data = yaml.safe_load((Path(__file__).parents[3] / "services/templater/templates/"
                           "offline.yaml").read_text())
    del data["relations"]  # they name templates this directory does not hold
    (tmp_path / "offline.yaml").write_text(yaml.safe_dump(data))
    bus = RecordingBus()
    with pytest.raises(PermanentError) as err:
        await Templater(load_templates(tmp_path), bus, dry_run=False).on_need(need("scale_in"))
    assert err.value.reason == "unknown_template"
    assert bus.published == []


async def test_a_need_that_cannot_be_planned_is_dead_lettered(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "version": 1, "need": "offline", "description": "x", "priority": 1,
        "mutex": ["node.{cluster}.{target}"],
        "steps": [{"name": "s", "action": "drain_node",
                   "args": {"node_id": "{target}-and-a-long-suffix"}}],
    }))
    long_target = need("offline").model_copy(update={"target": "n" * 120})
    bus = RecordingBus()
    with pytest.raises(PermanentError) as err:
        await Templater(load_templates(tmp_path), bus, dry_run=False).on_need(long_target)
    assert err.value.reason == "plan_failed"
    assert bus.published == []
