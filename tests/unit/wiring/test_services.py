"""Every service's subscriptions, on FastStream's in-memory broker (no Kafka, Redis or SQL).

For each app: the topics and consumer groups it subscribes (a renamed group would start
again from the earliest offset); a valid event reaches the right handler, parsed as its
topic's model; an invalid or oversize one goes to the topic's dead-letter topic with the
reason, and reaches no handler. The services' behaviour over the real broker is in
tests/integration/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from faststream import FastStream
from faststream.kafka import KafkaBroker

from agent import app as agent_app
from agent.app import Agent
from agent.settings import AgentSettings
from common.health.checks import Dependency
from common.health.service import ServiceHealth
from common.reportauth import UNAUTHENTICATED_RESULT, enrol_key, ensure_master, master_path
from common.settings import ServiceSettings
from schemas.access import Operation, Pattern, Principal, ResourceKind, acl_rules, group_prefix
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Envelope
from schemas.topics import Topic, dead_letter_name
from services.alerts import app as alerts_app
from services.alerts.handlers import AlertsService
from services.alerts.settings import AlertsSettings
from services.analyzer import app as analyzer_app
from services.analyzer.handlers import Analyzer
from services.analyzer.settings import AnalyzerSettings
from services.collector import app as collector_app
from services.collector.handlers import Collector, Prober
from services.collector.settings import CollectorSettings
from services.executor import app as executor_app
from services.executor.handlers import Executor
from services.executor.settings import ExecutorSettings
from services.inventory import app as inventory_app
from services.inventory.settings import InventorySettings
from services.router import app as router_app
from services.router.feed import ReportFeed
from services.router.handlers import Router
from services.router.settings import RouterSettings
from services.scheduler import app as scheduler_app
from services.scheduler.handlers import Scheduler
from services.scheduler.settings import SchedulerSettings
from services.store import app as store_app
from services.store.ml import MlRecorder
from services.store.plans import PlanRecorder
from services.store.recorder import Recorder as TaskRecorder
from services.store.settings import StoreSettings
from services.templater import app as templater_app
from services.templater.handlers import Templater
from services.templater.live import LiveTemplates
from services.templater.settings import TemplaterSettings
from services.tuner import app as tuner_app
from services.tuner.handlers import Tuner
from services.tuner.settings import TunerSettings
from tests.unit.wiring.harness import NAMESPACE, Wire, example_of, running, subscriptions
from warden import launcher

LIMIT = ServiceSettings().max_message_bytes


@dataclass(frozen=True)
class Service:
    build: Callable[[Path], FastStream]
    wires: tuple[Wire, ...]


def agent(state: Path) -> FastStream:
    return agent_app.create_app(AgentSettings(node_id="node-001", namespace=NAMESPACE,
                                              cluster_id="local", state_dir=str(state),
                                              jobs="sim"))


SERVICES: dict[str, Service] = {
    "analyzer": Service(
        lambda state: analyzer_app.create_app(
            AnalyzerSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.OPS_SAMPLES, "wiring.analyzer-samples", Analyzer, "on_samples",
              limit=2 * 1024 * 1024),
         Wire(Topic.OPS_NODE_STATE, "wiring.analyzer-node-state", Analyzer, "on_node_state"))),
    "collector": Service(
        lambda state: collector_app.create_app(
            CollectorSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.NODE_REPORTS, "wiring.collector", Collector, "on_reports", batch=True),
         Wire(Topic.NODE_COMMAND_RESULTS, "wiring.collector-probes", Prober, "on_result",
              sealed=True))),
    "templater": Service(
        lambda state: templater_app.create_app(
            TemplaterSettings(namespace=NAMESPACE, state_dir=str(state), instance="one")),
        (Wire(Topic.OPS_NEEDS, "wiring.templater", Templater, "on_need"),
         Wire(Topic.OPS_TEMPLATE_CHANGES, "wiring.templater-changes-one", LiveTemplates,
              "on_template_change"))),
    "scheduler": Service(
        lambda state: scheduler_app.create_app(
            SchedulerSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.OPS_TASKS, "wiring.scheduler", Scheduler, "on_task"),
         Wire(Topic.OPS_TASK_EVENTS, "wiring.scheduler-outcomes", Scheduler, "on_task_event"),
         Wire(Topic.OPS_POOL_HEALTH, "wiring.scheduler-pool-health", Scheduler,
              "on_pool_health"))),
    "executor": Service(
        lambda state: executor_app.create_app(
            ExecutorSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.OPS_TASKS_SCHEDULED, "wiring.executor-tasks", Executor, "on_scheduled"),
         Wire(Topic.NODE_COMMAND_RESULTS, "wiring.executor-results", Executor, "on_result",
              sealed=True),
         Wire(Topic.OPS_TASK_CONTROL, "wiring.executor-control", Executor, "on_control"))),
    "store": Service(
        lambda state: store_app.create_app(
            StoreSettings(namespace=NAMESPACE, state_dir=str(state),
                          database_url=f"sqlite+aiosqlite:///{state / 'warden.db'}")),
        (Wire(Topic.OPS_TASK_EVENTS, "wiring.store", TaskRecorder, "on_task_event"),
         Wire(Topic.ML_TASKS_SUBMITTED, "wiring.store-ml-submitted", MlRecorder,
              "on_submitted"),
         Wire(Topic.ML_DECISIONS, "wiring.store-ml-decisions", MlRecorder, "on_selected"),
         Wire(Topic.ML_TASKS_OUTCOMES, "wiring.store-ml-outcomes", MlRecorder, "on_outcome"),
         Wire(Topic.OPS_CAPACITY_PLANS, "wiring.store-capacity-plans", PlanRecorder,
              "on_plan"))),
    "tuner": Service(
        lambda state: tuner_app.create_app(
            TunerSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.OPS_SAMPLES, "wiring.tuner", Tuner, "on_samples"),)),
    "alerts": Service(
        lambda state: alerts_app.create_app(
            AlertsSettings(namespace=NAMESPACE, state_dir=str(state),
                           database_url=f"sqlite+aiosqlite:///{state / 'warden.db'}")),
        (Wire(Topic.OPS_ALERTS, "wiring.alerts", AlertsService, "on_alert"),)),
    "router": Service(
        lambda state: router_app.create_app(
            RouterSettings(namespace=NAMESPACE, state_dir=str(state))),
        (Wire(Topic.ML_TASKS_SUBMITTED, "wiring.router", Router, "on_submitted"),
         Wire(Topic.NODE_COMMAND_RESULTS, "wiring.router-results", Router, "on_result",
              sealed=True),
         Wire(Topic.NODE_REPORTS, "wiring.router-registry", ReportFeed, "on_reports",
              batch=True))),
    # Reads no topic: it reports the clusters' pending pods to Redis (services/inventory).
    "inventory": Service(
        lambda state: inventory_app.create_app(
            InventorySettings(namespace=NAMESPACE, state_dir=str(state))),
        ()),
    "agent": Service(
        agent,
        # Commands are checked against a 16 KiB limit before parsing.
        (Wire(Topic.NODE_COMMANDS, "wiring.agent-local-node-001", Agent, "on_command",
              limit=16_384),)),
}



def wires(*, strict_only: bool = False, sealed_only: bool = False) -> list[object]:
    """(service, wire) parameters; `strict_only`: only the topics parsed before the handler;
    `sealed_only`: only those read with the MAC of the node a message names."""
    return [pytest.param(name, wire, id=f"{name}-{wire.topic.value}")
            for name, service in SERVICES.items() for wire in service.wires
            if not (strict_only and wire.batch) and not (sealed_only and not wire.sealed)]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_service_subscribes_its_topics_in_its_groups(name: str, tmp_path: Path) -> None:
    service = SERVICES[name]
    broker = service.build(tmp_path).broker
    assert isinstance(broker, KafkaBroker)
    assert subscriptions(broker) == {
        (wire.wire_name, wire.group, wire.batch) for wire in service.wires}


@pytest.mark.parametrize(("name", "wire"), wires())
async def test_a_valid_event_reaches_its_handler_as_the_topics_model(
    name: str, wire: Wire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = SERVICES[name]
    event = example_of(wire.topic)
    body = event.model_dump_json().encode()
    async with running(monkeypatch, lambda: service.build(tmp_path), service.wires) as (
            broker, seen):
        await broker.publish(body, topic=wire.wire_name, key=event.subject.encode(),
                             headers=seal_of(wire, event, body, tmp_path))
    if wire.batch:
        # The batch handler validates each record itself, so one bad record fails alone.
        assert seen.calls == [(wire.handler, [body])]
    else:
        assert seen.calls == [(wire.handler, event)]
        assert type(seen.calls[0][1]) is TOPIC_MODELS[wire.topic]
    assert seen.dead == {w.wire_name: [] for w in service.wires}


def seal_of(wire: Wire, event: Envelope, body: bytes, state: Path) -> dict[str, str]:
    """The headers a node's agent sends with `body` on a sealed topic: its MAC under the
    report master of the service's state folder (made there at the service's start)."""
    if not wire.sealed:
        return {}
    key = enrol_key(ensure_master(master_path("", state)), event.cluster_id,
                    getattr(event, "node_id", event.subject))
    return key.headers(body)


@pytest.mark.parametrize(("name", "wire"), wires(strict_only=True, sealed_only=True))
async def test_an_answer_without_its_nodes_mac_is_dead_lettered_unread(
    name: str, wire: Wire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = SERVICES[name]
    event = example_of(wire.topic)
    body = event.model_dump_json().encode()
    async with running(monkeypatch, lambda: service.build(tmp_path), service.wires) as (
            broker, seen):
        await broker.publish(body, topic=wire.wire_name, key=event.subject.encode())
        other = enrol_key(ensure_master(master_path("", tmp_path)), event.cluster_id, "other")
        await broker.publish(body, topic=wire.wire_name, key=event.subject.encode(),
                             headers=other.headers(body))
    assert seen.calls == []
    assert [h["dlt-reason"] for h, _ in seen.dead[wire.wire_name]] == [
        UNAUTHENTICATED_RESULT, UNAUTHENTICATED_RESULT]


@pytest.mark.parametrize(("name", "wire"), wires(strict_only=True))
async def test_an_invalid_event_is_dead_lettered_with_its_reason(
    name: str, wire: Wire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = SERVICES[name]
    event = example_of(wire.topic)
    bad = event.model_dump_json().replace('"schema_version":1', '"schema_version":99').encode()
    assert bad != event.model_dump_json().encode()
    async with running(monkeypatch, lambda: service.build(tmp_path), service.wires) as (
            broker, seen):
        await broker.publish(bad, topic=wire.wire_name, key=event.subject.encode())
        # The key must be the event's subject.
        good = event.model_dump_json().encode()
        await broker.publish(good, topic=wire.wire_name, key=b"someone-else")
        # A keyless message would skip that check, so it is refused too.
        await broker.publish(good, topic=wire.wire_name)
    assert seen.calls == []
    letters = seen.dead[wire.wire_name]
    assert [body for _, body in letters] == [bad, good, good]
    assert [headers["dlt-reason"] for headers, _ in letters] == [
        "unsupported_version", "key_mismatch", "key_missing"]
    assert {headers["dlt-original-topic"] for headers, _ in letters} == {wire.wire_name}


@pytest.mark.parametrize(("name", "wire"), wires(strict_only=True))
async def test_the_size_limit_is_checked_before_parsing(
    name: str, wire: Wire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = SERVICES[name]
    limit = LIMIT if wire.limit is None else wire.limit
    async with running(monkeypatch, lambda: service.build(tmp_path), service.wires) as (
            broker, seen):
        for size in (limit, limit + 1):
            await broker.publish(b"x" * size, topic=wire.wire_name, key=b"k")
    assert seen.calls == []
    reasons = [headers["dlt-reason"] for headers, _ in seen.dead[wire.wire_name]]
    assert reasons[1] == "oversize"
    assert reasons[0] != "oversize"  # at the limit, it is parsed (and refused as bad JSON)


# What each service's /readyz asks beside the broker: what it cannot work without.
READINESS: dict[str, list[str]] = {
    "collector": ["redis"], "analyzer": ["redis"], "scheduler": ["redis"],
    "executor": ["redis"], "router": ["redis"], "inventory": ["redis"],
    "store": ["database"], "alerts": ["database"], "templater": ["database"],
    "tuner": ["redis", "database"],
}


def test_every_service_is_ready_only_while_what_it_uses_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: dict[str, list[str]] = {}
    building = ""

    class Recording(ServiceHealth):
        def __init__(self, broker: KafkaBroker, settings: ServiceSettings,
                     dependencies: Sequence[Dependency] = ()) -> None:
            asked[building] = [d.name for d in dependencies]
            super().__init__(broker, settings, dependencies)

    monkeypatch.setattr("services.shared.runtime.ServiceHealth", Recording)
    for building in launcher.SERVICES:
        SERVICES[building].build(tmp_path / building)
    assert asked == READINESS


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_the_acl_table_lets_each_service_read_what_it_subscribes(
        name: str, tmp_path: Path) -> None:
    # A subscription the table (schemas/access.py) does not allow would be refused by the
    # secured broker at start-up: the two must not drift apart.
    broker = SERVICES[name].build(tmp_path).broker
    assert isinstance(broker, KafkaBroker)
    principal = Principal(name)
    allowed = {(r.kind, r.pattern, r.resource, r.operation) for r in acl_rules(NAMESPACE)
               if r.principal is principal}
    for topic, group, _ in subscriptions(broker):
        assert (ResourceKind.TOPIC, Pattern.LITERAL, topic, Operation.READ) in allowed, topic
        assert (ResourceKind.TOPIC, Pattern.LITERAL, dead_letter_name(topic),
                Operation.WRITE) in allowed, topic
        assert group.startswith(group_prefix(principal, NAMESPACE)), group
        assert (ResourceKind.GROUP, Pattern.PREFIXED, group_prefix(principal, NAMESPACE),
                Operation.READ) in allowed
