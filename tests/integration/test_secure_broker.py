"""The secured broker (docs/security.md) as deploy/local/kafka.sh starts it: SASL/SCRAM over
TLS, a user per principal and the ACLs of schemas/access.py. A service does its job as its
own principal (an agent's reports become the collector's samples); a client holding the
agents' credentials cannot forge a dispatched task, an operator control or a command; a
client without credentials, or with wrong ones, cannot connect; topics are never created
by use."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from agent import fleet
from common.kafka_access import client_options
from common.settings import ServiceSettings
from common.signing import ensure_signer_keys
from schemas.access import GRANTS, SERVICE_PRINCIPALS, Principal
from schemas.events.v1 import SampleBatch
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Tap,
    is_success_of,
    is_up,
    task_events_for,
)
from tests.ports import free_port
from warden import launcher

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "kafka.sh"


@dataclass(frozen=True)
class SecureBroker:
    """A secured broker of this module's own; `env` holds its ports and state."""

    env: dict[str, str]

    def run(self, *args: str) -> str:
        answer = subprocess.run([str(SCRIPT), *args], env={**os.environ, **self.env},
                                capture_output=True, text=True, check=False, timeout=180)
        if answer.returncode != 0:
            pytest.fail(f"kafka.sh {' '.join(args)} failed:\n{answer.stdout}{answer.stderr}",
                        pytrace=False)
        return answer.stdout

    def settings_of(self, principal: Principal) -> dict[str, str]:
        """The connection settings of `principal` (what `kafka.sh env` prints)."""
        pairs = (shlex.split(line)[1].split("=", 1)
                 for line in self.run("env", principal).splitlines())
        return dict(pairs)

    def client(self, principal: Principal) -> dict[str, object]:
        settings = ServiceSettings.model_validate(self.settings_of(principal))
        return client_options(settings)


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    state = tmp_path_factory.mktemp("secure-kafka")
    broker = SecureBroker({"WARDEN_STATE_DIR": str(state), "KAFKA_SECURITY": "sasl_ssl",
                           "KAFKA_PORT": str(free_port()),
                           "KAFKA_CONTROLLER_PORT": str(free_port()), "KAFKA_HEAP": "512m"})
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop")


@pytest.fixture
def provisioned(secure_broker: SecureBroker, namespace: str) -> SecureBroker:
    """The secured broker with this test's namespace's topics and ACLs."""
    secure_broker.run("provision", namespace)
    return secure_broker


@asynccontextmanager
async def producer_as(broker: SecureBroker, principal: Principal) -> AsyncIterator[
        AIOKafkaProducer]:
    prod = AIOKafkaProducer(**broker.client(principal), enable_idempotence=True, acks="all",
                            request_timeout_ms=10_000)
    await prod.start()
    try:
        yield prod
    finally:
        await prod.stop()


def start_as_themselves(broker: SecureBroker, env: dict[str, str], state: Path,
                        names: tuple[str, ...]) -> list[launcher.ServiceProcess]:
    """Start each service as a process connected as its own principal."""
    return [svc for name in names
            for svc in launcher.start_services(
                state, {**env, **broker.settings_of(Principal(name))}, (name,))]


def print_logs(running: list[launcher.ServiceProcess]) -> None:
    for svc in running:
        text = svc.log_path.read_text(errors="replace")
        print(f"----- {svc.name} log (last 40 lines) -----")
        print("\n".join(text.splitlines()[-40:]))


async def test_the_slice_runs_with_every_service_as_its_own_principal(
    provisioned: SecureBroker, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # The thin slice (tests/integration/test_slice.py) on the secured broker: a GPU fault
    # becomes an offline need, a task, signed commands and a drained, offline node, with each
    # service and the agents allowed only what the table gives them.
    env = {"REDIS_URL": redis_url, "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "itest",
           "WARDEN_STATE_DIR": str(tmp_path), **SMALL_POOL_SAFETY}
    trusted = ensure_signer_keys(tmp_path / "keys")
    running = start_as_themselves(provisioned, env, tmp_path, launcher.SERVICES)
    agents = fleet.fleet_up(3, 2, "itest", namespace, tmp_path,
                            {**env, **provisioned.settings_of(Principal.AGENT)}, trusted, 1.0)
    await register(redis_url, namespace, "itest", [a.node_id for a in agents])
    # The test watches as the admin: it sees every topic and joins no group.
    consumer = AIOKafkaConsumer(topic_name(Topic.OPS_TASK_EVENTS, namespace),
                                topic_name(Topic.OPS_NODE_STATE, namespace),
                                **provisioned.client(Principal.ADMIN),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    failed = True
    try:
        await consumer.start()
        try:
            watch = Tap(consumer)
            for node in ("node-001", "node-002", "node-003"):
                await watch.wait_for(is_up(node), 120, f"{node} up")
            fleet.inject_fault(tmp_path, "node-002", xid=[79])
            await watch.wait_for(is_success_of(watch, "node-002"), 120,
                                 "the offline task for node-002 to succeed")
            states = [e.state for e in task_events_for(watch, "node-002")]
            assert states[:4] == ["created", "queued", "dispatched", "running"]
            assert task_events_for(watch, "node-001") == []
        finally:
            await consumer.stop()
        assert not launcher.dead_services(running), [s.name for s in
                                                     launcher.dead_services(running)]
        failed = False
    finally:
        fleet.fleet_down(tmp_path)
        launcher.stop_services(running)
        if failed:
            print_logs(running)


async def test_a_report_of_an_agent_becomes_the_collectors_samples(
    provisioned: SecureBroker, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    base = {"REDIS_URL": redis_url, "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "itest",
            "WARDEN_STATE_DIR": str(tmp_path)}
    collector = start_as_themselves(provisioned, base, tmp_path, ("collector",))
    trusted = ensure_signer_keys(tmp_path / "keys")
    agents = fleet.fleet_up(1, 1, "itest", namespace, tmp_path,
                            {**base, **provisioned.settings_of(Principal.AGENT)}, trusted, 0.5)
    await register(redis_url, namespace, "itest", [a.node_id for a in agents])
    # The analyzer's principal reads the samples (in a group of its own, as it may).
    consumer = AIOKafkaConsumer(topic_name(Topic.OPS_SAMPLES, namespace),
                                **provisioned.client(Principal.ANALYZER),
                                group_id=f"{namespace}.analyzer-test",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        await consumer.start()
        try:
            record = await Tap(consumer).wait_for(
                lambda r: any(s.node_id == "node-001"
                              for s in SampleBatch.model_validate_json(r.value).samples),
                90, "a sample of node-001")
        finally:
            await consumer.stop()
        assert record.key is not None
        assert not launcher.dead_services(collector)
    except BaseException:
        print_logs(collector)
        raise
    finally:
        fleet.fleet_down(tmp_path)
        launcher.stop_services(collector)


@pytest.mark.parametrize("topic", [Topic.OPS_TASKS_SCHEDULED, Topic.OPS_TASK_CONTROL,
                                   Topic.NODE_COMMANDS])
async def test_the_agents_principal_cannot_forge_tasks_controls_or_commands(
    provisioned: SecureBroker, namespace: str, topic: Topic
) -> None:
    async with producer_as(provisioned, Principal.AGENT) as prod:
        # What an agent may write goes through on the same connection ...
        await (await prod.send(topic_name(Topic.NODE_REPORTS, namespace), b"{}", key=b"n"))
        # ... what only the scheduler, the API or the executor may write is refused.
        with pytest.raises(TopicAuthorizationFailedError):
            await (await prod.send(topic_name(topic, namespace), b"{}", key=b"node-001"))


@pytest.mark.timeout(300)
async def test_every_principal_may_write_exactly_the_topics_of_its_grant(
    provisioned: SecureBroker, namespace: str
) -> None:
    """Every topic against every principal's credentials (schemas/access.py): a write the
    grant names goes through, any other is refused by the broker, so no credentials one
    service holds can put a message on a topic that another service acts on."""
    wrong: list[str] = []
    for principal in SERVICE_PRINCIPALS:
        # Not idempotent: the refusal must come from the topic's ACL, not from a missing
        # IdempotentWrite on the cluster (a principal that writes nothing has none).
        prod = AIOKafkaProducer(**provisioned.client(principal), acks="all",
                                request_timeout_ms=10_000)
        await prod.start()
        try:
            for topic in Topic:
                wire = topic_name(topic, namespace)
                allowed = topic in GRANTS[principal].writes
                try:
                    await (await prod.send(wire, b"{}", key=b"forged"))
                    refused = False
                except TopicAuthorizationFailedError:
                    refused = True
                if refused == allowed:
                    wrong.append(f"{principal} {'refused' if refused else 'allowed'} {topic}")
        finally:
            await prod.stop()
    assert not wrong, wrong


async def test_the_agents_principal_cannot_read_what_is_not_its_own(
    provisioned: SecureBroker, namespace: str
) -> None:
    consumer = AIOKafkaConsumer(topic_name(Topic.OPS_TASK_CONTROL, namespace),
                                **provisioned.client(Principal.AGENT),
                                group_id=f"{namespace}.agent-itest-node-001",
                                auto_offset_reset="earliest")
    try:
        # Refused while joining: the broker will not even say where the topic lives.
        with pytest.raises(TopicAuthorizationFailedError):
            await consumer.start()
    finally:
        await consumer.stop()


async def test_a_client_without_credentials_or_with_wrong_ones_cannot_connect(
    provisioned: SecureBroker
) -> None:
    good = provisioned.client(Principal.AGENT)
    plaintext = AIOKafkaProducer(bootstrap_servers=good["bootstrap_servers"],
                                 request_timeout_ms=5_000)
    with pytest.raises(KafkaError):
        await plaintext.start()
    await plaintext.stop()
    forged = AIOKafkaProducer(**{**good, "sasl_plain_password": "not-the-password"},
                              request_timeout_ms=5_000)
    with pytest.raises(KafkaError):
        await forged.start()
    await forged.stop()


async def test_topics_are_never_created_by_use(
    provisioned: SecureBroker, namespace: str
) -> None:
    # Even the super user, who may create topics, makes none by producing to a new name.
    missing = f"{namespace}.no-such-topic.v1"
    async with producer_as(provisioned, Principal.ADMIN) as prod:
        with pytest.raises(KafkaError):
            await (await prod.send(missing, b"{}", key=b"k"))
    admin = AIOKafkaAdminClient(**provisioned.client(Principal.ADMIN))
    await admin.start()
    try:
        assert missing not in await admin.list_topics()
        assert topic_name(Topic.NODE_REPORTS, namespace) in await admin.list_topics()
    finally:
        await admin.close()
