"""The task store service on the real broker: every TaskEvent recorded once, replays ignored.

A scale-in task and its child (created, queued, dispatched, running, steps started, failed,
retried, skipped and completed with their initial and target resources, succeeded) are
published twice on `ops.task-events.v1` before the store service (a real process, started by
the launcher) runs; it must record each event once. Publishing them all a third time while it
runs must change nothing once it has consumed them. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from schemas.topics import PARTITIONS, Topic, dead_letter_name
from services.store.db import Store, open_store
from services.store.models import StepRecord, Task, Transition
from services.store.queries import TaskFilter, get_task, list_tasks
from services.store.views import TaskDetail
from tests.integration.harness import name, producer, services, stack_env, until
from tests.unit.store.scenario import RESOURCES, Story, scale_in_story


async def publish(bootstrap: str, topic: str, story: Story) -> None:
    async with producer(bootstrap) as prod:
        for event in story.events:
            await prod.send_and_wait(topic, event.model_dump_json().encode(),
                                     key=event.subject.encode())


async def counts(store: Store) -> dict[str, int]:
    async with store.session() as session:
        return {model.__tablename__: int((await session.execute(
            select(func.count()).select_from(model))).scalar_one())
            for model in (Task, StepRecord, Transition)}


async def details(store: Store, story: Story) -> tuple[TaskDetail, TaskDetail]:
    async with store.session() as session:
        parent = await get_task(session, story.parent.task_id)
        child = await get_task(session, story.child.task_id)
    assert parent is not None
    assert child is not None
    return parent, child


async def group_caught_up(bootstrap: str, group: str, topic: str) -> bool:
    """True once `group` has committed the end of every partition of `topic`."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS[Topic.OPS_TASK_EVENTS])]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    await admin.start()
    try:
        ends: dict[Any, int] = await consumer.end_offsets(partitions)
        committed: dict[Any, Any] = await admin.list_consumer_group_offsets(group)
        return all(tp in committed and committed[tp].offset >= ends[tp] for tp in partitions)
    finally:
        await admin.close()
        await consumer.stop()


async def dead_letters(bootstrap: str, topic: str) -> int:
    """How many messages of `topic` were dead-lettered (a recorder error would be)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends: dict[Any, int] = await consumer.end_offsets(
            [TopicPartition(dead_letter_name(topic), 0)])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def test_the_store_records_each_event_once(kafka_bootstrap: str, redis_url: str,
                                                 namespace: str, database_url: str,
                                                 tmp_path: Path) -> None:
    story = scale_in_story(cluster="itest", node="node-002")
    topic = name(Topic.OPS_TASK_EVENTS, namespace)
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    DATABASE_URL=database_url)
    store = open_store(database_url)

    async def all_recorded() -> bool:
        try:
            return (await counts(store))["transitions"] == len(story.events)
        except SQLAlchemyError:
            return False  # the service has not made the schema yet

    try:
        async with services(env, tmp_path, names=("store",)):
            # `services` makes the topics; the events go out before the consumer starts
            # reading, each twice.
            for _ in range(2):
                await publish(kafka_bootstrap, topic, story)
            await until(all_recorded, 60, "every task event recorded")
            await until(lambda: group_caught_up(kafka_bootstrap, f"{namespace}.store", topic),
                        30, "the store's consumer group at the end of the topic")
            assert await counts(store) == {"tasks": 2, "steps": 5,
                                           "transitions": len(story.events)}
            parent, child = await details(store, story)
            assert parent.state == child.state == "succeeded"
            assert [c.task_id for c in parent.children] == [story.child.task_id]
            assert child.parent_task_id == story.parent.task_id
            assert parent.steps[0].outputs == {**RESOURCES, "nodes": "node-002",
                                               "children": 1, "succeeded": 1, "failed": 0}
            assert [(s.name, s.state, s.attempts) for s in child.steps] == [
                ("drain", "completed", 2), ("migrate-jobs", "skipped", 0),
                ("release", "completed", 1)]
            assert [(t.state, t.actor) for t in parent.transitions[:3]] == [
                ("created", "templater"), ("queued", "scheduler"), ("dispatched", "scheduler")]
            async with store.session() as session:
                rows, total = await list_tasks(session, TaskFilter(node="node-002"))
            assert total == 1
            assert rows[0].task_id == story.child.task_id

            # A replay of the whole topic's worth of events while it runs.
            before = (await counts(store), await details(store, story))
            await publish(kafka_bootstrap, topic, story)
            await until(lambda: group_caught_up(kafka_bootstrap, f"{namespace}.store", topic),
                        30, "the replay consumed")
            assert (await counts(store), await details(store, story)) == before
            assert await dead_letters(kafka_bootstrap, topic) == 0
    finally:
        await store.close()
