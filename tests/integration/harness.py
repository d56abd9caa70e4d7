"""Helpers for integration tests: real service processes and a tap on real topics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agent import fleet
from common.messaging import delete_topics, ensure_topics
from common.reportauth import enrol_key, ensure_master, master_path
from schemas.events.v1 import NodeReport, OpsNeed, TaskEvent
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from tests.ports import free_port
from tests.waiting import eventually
from warden import launcher


class Record(Protocol):
    """What the tests read of an aiokafka `ConsumerRecord[bytes, bytes]`.

    aiokafka ships no type information, so this spells it out. Every event on the control
    plane's topics has a body (nothing publishes tombstones), hence `value` is bytes.
    """

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass
class Tap:
    """Reads topics from the beginning and keeps every record, for assertions."""

    consumer: AIOKafkaConsumer
    records: list[Record] = field(default_factory=list)

    async def wait_for(self, predicate: Callable[[Record], bool], timeout_s: float,
                       what: str, *, start: int = 0) -> Record:
        """The first record (from index `start` of `records` on) that satisfies `predicate`.

        `start=len(tap.records)` looks only at what arrives from now on: without it a record
        read earlier (say, a node's previous "down") satisfies the wait at once."""
        deadline = time.monotonic() + timeout_s
        seen = start
        while True:
            for record in self.records[seen:]:
                if predicate(record):
                    return record
            seen = len(self.records)
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
            batches = await self.consumer.getmany(timeout_ms=250)
            for recs in batches.values():
                self.records.extend(recs)

    async def catch_up(self, timeout_s: float = 60.0) -> None:
        """Read everything published to the tapped topics until now (not for a while)."""
        self.records.extend(await read_to_end(self.consumer, timeout_s, "the tapped topics"))


async def read_to_end(consumer: AIOKafkaConsumer, timeout_s: float,
                      what: str) -> list[Record]:
    """The records from the consumer's position to the end its partitions have now.

    The end offsets are taken once, at the call: whatever was published before it is read,
    however slow the broker, and the call ends as soon as it is (no idle timeout)."""
    deadline = time.monotonic() + timeout_s
    records: list[Record] = []

    def expired() -> bool:
        return time.monotonic() > deadline

    while not consumer.assignment():  # a consumer just started has no partitions yet
        if expired():
            raise AssertionError(f"timed out after {timeout_s}s waiting for the partitions "
                                 f"of {what}")
        for recs in (await consumer.getmany(timeout_ms=100)).values():
            records.extend(recs)
    partitions = list(consumer.assignment())
    ends = await consumer.end_offsets(partitions)
    while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
        if expired():
            raise AssertionError(f"timed out after {timeout_s}s reading {what} to its end")
        for recs in (await consumer.getmany(timeout_ms=250)).values():
            records.extend(recs)
    return records


@asynccontextmanager
async def tap(bootstrap: str, *topics: str) -> AsyncIterator[Tap]:
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        yield Tap(consumer)
    finally:
        await consumer.stop()


@asynccontextmanager
async def watched_fleet(env: dict[str, str], state: Path, trusted: list[Path],
                        topics: Sequence[Topic],
                        count: int = 3, interval_s: float = 1.0) -> AsyncIterator[Tap]:
    """`count` enrolled agents of cluster itest (one GPU each, reporting every `interval_s`)
    and a tap on `topics`; the agents are stopped on the way out."""
    namespace = env["WARDEN_NAMESPACE"]
    agents = fleet.fleet_up(count, 1, "itest", namespace, state, env, trusted, interval_s)
    await register(env["REDIS_URL"], namespace, "itest", [a.node_id for a in agents])
    try:
        async with tap(env["KAFKA_BOOTSTRAP_SERVERS"],
                       *(name(t, namespace) for t in topics)) as watch:
            yield watch
    finally:
        fleet.fleet_down(state)


@asynccontextmanager
async def producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await prod.start()
    try:
        yield prod
    finally:
        await prod.stop()


# The test fleets have three nodes, far below the pools the safety defaults are made for:
# one node offline and one down is half the counted pool unhealthy, and the 10% offline
# budget rounds to one node. Tests that take two nodes out widen both limits.
SMALL_POOL_SAFETY = {
    "SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION": "0.5",
    "SCHEDULER_OFFLINE_BUDGET_FRACTION": "1.0",
}


def signed(report: NodeReport, state_dir: Path) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A report's bytes and the headers its own node's key gives them, as its agent sends
    them (the key enrolment derives from the master of the collector run in `state_dir`)."""
    key = enrol_key(ensure_master(master_path("", state_dir)), report.cluster_id,
                    report.node_id)
    body = report.model_dump_json().encode()
    return body, [(k, v.encode()) for k, v in key.headers(body).items()]


def stack_env(bootstrap: str, redis_url: str, namespace: str, state_dir: Path,
              **extra: str) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "REDIS_URL": redis_url,
        "WARDEN_NAMESPACE": namespace,
        "WARDEN_CLUSTER_ID": "itest",
        "WARDEN_STATE_DIR": str(state_dir),
        **extra,
    }


@asynccontextmanager
async def services(env: dict[str, str], state_dir: Path,
                   names: tuple[str, ...] = launcher.SERVICES) -> AsyncIterator[
                       list[launcher.ServiceProcess]]:
    """Run services as real processes; print their logs if the test fails."""
    await ensure_topics(env["KAFKA_BOOTSTRAP_SERVERS"], env["WARDEN_NAMESPACE"])
    running = launcher.start_services(state_dir, env, names)
    failed = True
    try:
        yield running
        # A service that died during the test is a failure, whatever the test saw.
        assert not launcher.dead_services(running), [s.name for s in
                                                     launcher.dead_services(running)]
        failed = False
    finally:
        launcher.stop_services(running)
        with contextlib.suppress(Exception):  # housekeeping: never the reason a test fails
            await delete_topics(env["KAFKA_BOOTSTRAP_SERVERS"], env["WARDEN_NAMESPACE"])
        if failed:
            for svc in running:
                text = svc.log_path.read_text(errors="replace")
                print(f"----- {svc.name} log (last 60 lines) -----")
                print("\n".join(text.splitlines()[-60:]))


def name(topic: Topic, namespace: str) -> str:
    return topic_name(topic, namespace)


async def until(check: Callable[[], object], timeout_s: float,
                what: str | Callable[[], str]) -> None:
    """Poll an async-or-sync check until it returns truthy, at a service's pace (0.2 s).

    `what` may be a function: it is called on timeout, so the message can say how far the
    condition got (the figures it was judged on)."""
    await eventually(check, what, timeout_s=timeout_s, poll_s=0.2)


def log_lines(path: Path, since: int = 0) -> list[str]:
    """The complete lines a service has written to its log at `path` from byte `since` on.

    `since` is a size the log had earlier (`path.stat().st_size`): what was written after it.
    A line still being written is left for the next read."""
    data = path.read_bytes()
    tail = data[since:]
    if since and data[since - 1:since] != b"\n":
        tail = tail.partition(b"\n")[2]  # the rest of a line begun before `since`
    return tail.decode(errors="replace").split("\n")[:-1]


async def log_shows(path: Path, check: Callable[[str], bool], what: str, *, count: int = 1,
                    since: int = 0, timeout_s: float = 60.0) -> list[str]:
    """Wait until `count` lines of a service's log (from byte `since` on) satisfy `check`.

    A service's log is a record of its progress: a line it writes on every dispatcher tick
    (say, a task held back), seen `count` times, shows it has been round that many times."""
    found: list[str] = []

    def enough() -> bool:
        found[:] = [line for line in log_lines(path, since) if check(line)]
        return len(found) >= count

    await until(enough, timeout_s,
                lambda: f"{what} ({len(found)} of {count} line(s) in {path.name})")
    return found


async def processed(bootstrap: str, group: str, records: Sequence[Record]) -> bool:
    """True once consumer group `group` has committed past every one of `records`.

    The services commit a message after their handler returns (and whatever it published
    was acknowledged), so this says the service has handled them: for a check that
    something did not follow from them, the window is over."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed: dict[Any, Any] = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()

    def past(record: Record) -> bool:
        offset = committed.get(TopicPartition(record.topic, record.partition))
        return offset is not None and int(offset.offset) > record.offset

    return all(past(record) for record in records)


def a_need(kind: str, target: str) -> Callable[[Record], bool]:
    """True for a need record of `kind` about `target`."""
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.OPS_NEEDS.value):
            return False
        need = OpsNeed.model_validate_json(record.value)
        return need.kind == kind and need.target == target
    return check


def is_up(node: str) -> Callable[[Record], bool]:
    """True for a node-state record saying `node` is up."""
    def check(record: Record) -> bool:
        return record.key == node.encode() and b'"state":"up"' in record.value
    return check


def task_events_for(events: Tap, target: str) -> list[TaskEvent]:
    """Every task event of the tasks whose target is `target`, in order."""
    parsed = [TaskEvent.model_validate_json(r.value) for r in events.records
              if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]
    task_ids = {e.task_id for e in parsed if e.task is not None and e.task.target == target}
    return [e for e in parsed if e.task_id in task_ids]


def is_success_of(events: Tap, target: str) -> Callable[[Record], bool]:
    """True once a task whose target is `target` has succeeded."""
    def check(record: Record) -> bool:
        return any(e.state == "succeeded" for e in task_events_for(events, target))
    return check


@dataclass(frozen=True)
class ApiSite:
    """Where a test's API listens and keeps its store: a free port and, unless the test names
    another database, a SQLite file in its folder."""

    port: int
    database_url: str

    @classmethod
    def at(cls, folder: Path, database_url: str | None = None) -> ApiSite:
        return cls(free_port(), database_url or f"sqlite+aiosqlite:///{folder / 'warden.db'}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, tokens: str) -> dict[str, str]:
        """The API's settings (and the store's, for every service): `tokens` as API_TOKENS."""
        return {"DATABASE_URL": self.database_url, "API_HOST": "127.0.0.1",
                "API_PORT": str(self.port), "API_TOKENS": tokens}


def edited_templates(directory: Path, file: str, old: str, new: str,
                     *also: tuple[str, str, str]) -> Path:
    """The built-in templates copied into `directory`, with `old` replaced by `new` in `file`
    (which must contain it: a test never runs on a template it did not mean to change), and
    each further (file, old, new) edit of `also`."""
    from services.templater import templates as builtin_templates

    source = Path(builtin_templates.__file__).parent / "templates"
    directory.mkdir(parents=True, exist_ok=True)
    edits = [(file, old, new), *also]
    for template in source.glob("*.yaml"):
        text = template.read_text()
        for name, before, after in edits:
            if template.name == name:
                assert before in text, f"{name} no longer has {before!r}"
                text = text.replace(before, after)
        (directory / template.name).write_text(text)
    return directory


def short_drain_templates(directory: Path, drain_timeout_s: float) -> Path:
    """The built-in templates, with the offline drain's timeout cut to `drain_timeout_s`, so a
    drain an agent ignores (fault plan `ignore_commands`) keeps a task running for that long."""
    drain = 'action: drain_node\n    args: {node_id: "{target}"}\n    timeout_s: 60'
    return edited_templates(directory, "offline.yaml", drain,
                            drain.replace("60", f"{drain_timeout_s:g}"))


async def alertmanager_groups(base: str, namespace: str) -> list[dict[str, Any]]:
    """Alertmanager's own view (`GET /api/v2/alerts/groups`) of one deployment's alerts: the
    alerts service labels each with its namespace."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        response = await client.get(f"{base}/api/v2/alerts/groups",
                                    params={"filter": f'namespace="{namespace}"'})
    response.raise_for_status()
    groups: list[dict[str, Any]] = response.json()
    return groups


def active_alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [alert for group in groups for alert in group["alerts"]
            if alert["status"]["state"] == "active"]
