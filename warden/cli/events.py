"""`warden events`: a readable line for each node state, need, task transition and alert, or
with `--json` one JSON object per line for scripts: `{"topic": ..., "event": ...}`, the event
as its model dumps it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Annotated

import typer
from aiokafka import AIOKafkaConsumer

from common.kafka_access import client_options
from common.settings import ServiceSettings
from schemas.catalog import TOPIC_MODELS
from schemas.events.v1 import Alert, NodeState, OpsNeed, TaskEvent
from schemas.topics import Topic, topic_name
from warden.cli.common import service_settings

WATCHED = (Topic.OPS_NODE_STATE, Topic.OPS_NEEDS, Topic.OPS_TASK_EVENTS, Topic.OPS_ALERTS)


def describe(topic: Topic, body: bytes) -> str:
    """One readable line for an event on a watched topic."""
    event = TOPIC_MODELS[topic].model_validate_json(body)
    stamp = event.occurred_at.strftime("%H:%M:%S")
    if isinstance(event, NodeState):
        return (f"{stamp} node   {event.node_id:<10} {event.previous or '-'} -> {event.state}"
                f"  ({event.reason})")
    if isinstance(event, OpsNeed):
        ev = event.evidence[0]
        return (f"{stamp} need   {event.kind:<8} {event.target:<10} {ev.metric}={ev.value:g} "
                f"outside [{ev.range_low:g}, {ev.range_high:g}] {ev.detail}")
    if isinstance(event, TaskEvent):
        step = ""
        if event.step_index is not None:
            step = f" step {event.step_index} {event.step_state}"
        child = f" (child of {str(event.parent_task_id)[:8]})" if event.parent_task_id else ""
        return (f"{stamp} task   {str(event.task_id)[:8]}  {event.state}{step}  {event.reason}"
                f"{child}{step_effect(event.outputs)}")
    if isinstance(event, Alert):
        return f"{stamp} ALERT  {event.severity:<8} {event.kind}: {event.message}"
    return f"{stamp} {event.event_type}"


def json_line(topic: Topic, body: bytes) -> str:
    """One JSON object for an event on a watched topic: the topic (its name without the
    namespace) and the event as its model dumps it. Nested, so no field of a future event can
    clash with `topic`."""
    event = TOPIC_MODELS[topic].model_validate_json(body)
    return json.dumps({"topic": topic.value, "event": event.model_dump(mode="json")})


def step_effect(outputs: Mapping[str, object]) -> str:
    """What a completed step did, in a few words, for the steps an operator cares about."""
    if "resumed_step" in outputs and outputs.get("started"):
        return (f"\n           -> job {outputs.get('job_id')} runs again, from step "
                f"{outputs['resumed_step']}")
    if "step" in outputs and "checkpoint" in outputs:
        return f"\n           -> job {outputs.get('job_id')} checkpointed at step {outputs['step']}"
    if outputs.get("added"):
        return f"\n           -> added {outputs.get('added_nodes')}: {outputs.get('reason')}"
    if outputs.get("released"):
        return f"\n           -> {outputs.get('node')} {outputs.get('reason')}"
    return ""


async def watch(settings: ServiceSettings, until_task_state: str | None = None,
                timeout_s: float | None = None, as_json: bool = False) -> int:
    """Print node states, needs and task events as they happen; returns 0 on `until` state.

    With `as_json`, standard output carries only the events' JSON lines: what cannot be read
    is said on standard error."""
    render: Callable[[Topic, bytes], str] = json_line if as_json else describe
    names = {topic_name(t, settings.namespace): t for t in WATCHED}
    consumer = AIOKafkaConsumer(*names, **client_options(settings),
                                auto_offset_reset="latest", enable_auto_commit=False)
    await consumer.start()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while deadline is None or time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    topic = names[record.topic]
                    try:
                        typer.echo(render(topic, record.value or b""))
                    except ValueError as err:
                        typer.echo(f"(unreadable event on {record.topic}: {err})", err=as_json)
                        continue
                    if until_task_state and topic is Topic.OPS_TASK_EVENTS:
                        event = json.loads(record.value or b"{}")
                        if event.get("state") == until_task_state:
                            return 0
        return 1
    finally:
        await consumer.stop()


def events(as_json: Annotated[bool, typer.Option(
        "--json", help='One JSON object per line, {"topic": ..., "event": ...}: the event as '
                       "its model dumps it.")] = False) -> None:
    """Follow node states, needs, task transitions and alerts (Ctrl-C to stop)."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(watch(service_settings(), as_json=as_json))
