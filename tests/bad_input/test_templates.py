"""B26 (and B23) at the templater: a need no template serves, and a template whose
parameters are out of their bounds or whose step is not an allowed action. The templater
refuses both before any task exists, so nothing can be scheduled: the need is dead-lettered
`unknown_template` (PermanentError), and the template is refused when it is loaded, naming
its file and field (the API refuses to save it: tests/bad_input/test_api.py). The project
has no task-level `param_bounds` failure: a task is never made from parameters its step
schema refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import PermanentError
from schemas.events.v1 import NeedKind
from services.templater.handlers import Templater
from services.templater.templates import Template, TemplateError, load_templates
from tests.integration.harness import edited_templates
from tests.unit.templater.test_handler import RecordingBus, need


async def test_a_need_no_template_serves_is_dead_lettered_and_nothing_is_made_B26() -> None:
    """B26: the templater raises PermanentError `unknown_template` (the need is
    dead-lettered), publishes neither the task nor its `created` event, and goes on serving
    the other needs."""
    templates: dict[NeedKind, Template] = {
        kind: t for kind, t in load_templates().items() if kind != "scale_in"}
    bus = RecordingBus()
    templater = Templater(templates, bus, dry_run=False)
    with pytest.raises(PermanentError) as refused:
        await templater.on_need(need("scale_in"))
    assert refused.value.reason == "unknown_template"
    assert "scale_in" in refused.value.detail
    assert bus.published == []
    # The same templater still makes tasks for the needs it serves.
    await templater.on_need(need("scale_out"))
    assert len(bus.published) == 2


@pytest.mark.parametrize(("old", "new", "problem"), [
    ('args: {pool: "{pool}"}', 'args: {pool: "{pool}", nodes: 1000000000}',
     "load_balance.yaml: steps.1.args.nodes: Input should be less than or equal to 64"),
    ("jobs_per_run: 1", "jobs_per_run: 1000000000",
     "load_balance.yaml: steps.0.args.max_jobs: Input should be less than or equal to 64"),
    ("jobs_per_run: 1", "jobs_per_run: -1",
     "load_balance.yaml: steps.0.args.max_jobs: Input should be greater than or equal to 1"),
    ("action: migrate_jobs", "action: exec_shell",
     "load_balance.yaml: steps.0.action: unknown action 'exec_shell' (one of: drain_node,"),
])
def test_a_template_with_parameters_out_of_bounds_is_not_loaded_B26_B23(
        tmp_path: Path, old: str, new: str, problem: str) -> None:
    """B26 (and B23 at the executor's end: a step whose action is not on the allow-list): the
    templater refuses the template as it loads it, naming file and field, so no task is ever
    made from it and nothing reaches the executor or an agent."""
    directory = edited_templates(tmp_path / "templates", "load_balance.yaml", old, new)
    with pytest.raises(TemplateError) as refused:
        load_templates(directory)
    assert str(refused.value).startswith(problem)
