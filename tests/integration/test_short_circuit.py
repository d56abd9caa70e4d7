"""The pool short-circuit on the real broker and Redis: an offline task in a pool that is 60%
unhealthy stays queued and raises one alert, and is dispatched once the pool is healthy."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

from schemas.events.v1 import Alert, NodeStateName, OpsTask, PoolHealth, TaskEvent, now_utc
from schemas.topics import Topic
from tests.contracts.examples import example
from tests.integration.harness import Tap, log_shows, name, producer, services, stack_env, tap

# Dispatcher ticks the task must be seen held back in before its absence is judged.
TICKS = 5


def pool_health(states: dict[NodeStateName, int], unhealthy: float) -> PoolHealth:
    """Pool `default` of cluster itest, as the analyzer would publish it now."""
    return PoolHealth(
        event_id=uuid4(), source="analyzer", occurred_at=now_utc(), cluster_id="itest",
        subject="default", pool="default", nodes_total=sum(states.values()),
        nodes_by_state=states, unhealthy_fraction=unhealthy, gpu_utilization_pct=50.0,
        effective_utilization_pct=50.0,
    )


def dispatched(events: Tap, task: OpsTask) -> bool:
    return any(
        TaskEvent.model_validate_json(r.value).task_id == task.task_id
        and TaskEvent.model_validate_json(r.value).state == "dispatched"
        for r in events.records if r.topic.endswith(Topic.OPS_TASK_EVENTS.value))


def alerts(events: Tap) -> list[Alert]:
    return [Alert.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_ALERTS.value)]


async def send(bootstrap: str, namespace: str, topic: Topic, event: PoolHealth | OpsTask) -> None:
    async with producer(bootstrap) as prod:
        await prod.send_and_wait(name(topic, namespace),
                                 event.model_dump_json().encode(), key=event.subject.encode())


async def test_a_sick_pool_holds_an_offline_task_until_it_is_healthy(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO")
    task_id = uuid4()
    task = example("ops_task", OpsTask).model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": "itest",
        "subject": str(task_id), "task_id": task_id, "need_id": uuid4()})
    async with services(env, tmp_path, ("scheduler",)) as running, tap(
            kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
            name(Topic.OPS_ALERTS, namespace)) as watch:
        await send(kafka_bootstrap, namespace, Topic.OPS_POOL_HEALTH,
                   pool_health({"up": 4, "down": 6}, 0.6))
        await send(kafka_bootstrap, namespace, Topic.OPS_TASKS, task)

        alert = await watch.wait_for(
            lambda r: r.topic.endswith(Topic.OPS_ALERTS.value), 30, "the short-circuit alert")
        raised = Alert.model_validate_json(alert.value)
        assert (raised.kind, raised.dedup_key) == ("short_circuit", "short-circuit.itest.default")
        # Held for many dispatcher ticks, yet never dispatched and alerted only once. The
        # scheduler says so on every tick that holds it back: once it has said so TICKS
        # times, the ticks before the last have ended and whatever they published is on
        # the topics.
        await log_shows(running[0].log_path,
                        lambda line: f"task {task_id} held back by pool itest/default" in line,
                        f"task {task_id} held back by the short-circuit", count=TICKS)
        await watch.catch_up()
        assert not dispatched(watch, task)
        assert len(alerts(watch)) == 1

        await send(kafka_bootstrap, namespace, Topic.OPS_POOL_HEALTH,
                   pool_health({"up": 10}, 0.0))
        await watch.wait_for(lambda _: dispatched(watch, task), 30, "the task dispatched")
