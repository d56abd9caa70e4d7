"""The executor's spans: every step, its command and its result in the trace of the task.

A workflow keeps the trace context it was started in (the journal's `trace` field); a step
started from a handler of that trace is a child of the handler's span, one started by a
sweep, a retry or an operator's control continues the stored trace (common/tracing.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace

from common.tracing import resumed_span, task_attributes
from services.executor.journal import Workflow

tracer = trace.get_tracer("clusterwarden.executor")


def step_attributes(wf: Workflow) -> dict[str, str | int]:
    """The task's attributes and its current step's: which, what, on which node, which try."""
    step = wf.task.steps[wf.step]
    attributes: dict[str, str | int] = {
        **task_attributes(wf.task), "task.epoch": wf.epoch, "step.index": wf.step,
        "step.name": step.name, "step.action": step.action.action,
        "step.attempt": wf.attempt + 1, "step.run": wf.run,
    }
    # An agent's command names its node; so do some centre actions (migrate_jobs).
    node = getattr(step.action, "node_id", None)
    if isinstance(node, str):
        attributes["node.id"] = node
    if wf.command_id:
        attributes["command.id"] = wf.command_id
    return attributes


@contextmanager
def step_span(name: str, wf: Workflow) -> Iterator[trace.Span]:
    """A span about the workflow's current step, in the workflow's trace."""
    with resumed_span(tracer, name, wf.trace_context,
                      attributes=step_attributes(wf)) as span:
        yield span
