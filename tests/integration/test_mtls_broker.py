"""The mutual-TLS broker (docs/security.md) as deploy/local/kafka.sh starts it with
KAFKA_SECURITY=mtls: the client certificate the script's CA signed for a principal is that
principal, under the same ACLs as its SCRAM user on the SASL broker; a client without a
certificate, or with one of another CA, is refused by the broker in the TLS handshake."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from common.kafka_access import client_options
from common.settings import ServiceSettings
from schemas.access import GRANTS, SERVICE_PRINCIPALS, Principal
from schemas.topics import Topic, topic_name
from tests.integration.test_secure_broker import SecureBroker
from tests.ports import free_port
from tests.tls import client_certificate


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    state = tmp_path_factory.mktemp("mtls-kafka")
    broker = SecureBroker({"WARDEN_STATE_DIR": str(state), "KAFKA_SECURITY": "mtls",
                           "KAFKA_PORT": str(free_port()),
                           "KAFKA_CONTROLLER_PORT": str(free_port()), "KAFKA_HEAP": "512m"})
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop")


def broker_alert(bootstrap: str, context: ssl.SSLContext) -> str | None:
    """The TLS alert the broker ends a new connection with, or None if it keeps it open."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                # In TLS 1.3 the client's side of the handshake is over before the broker has
                # judged its certificate: the verdict is the first thing the broker sends. An
                # accepted client hears nothing, as a Kafka broker speaks only when asked.
                tls.settimeout(1.0)
                data = tls.recv(1)
        except TimeoutError:
            return None
        except ssl.SSLError as error:
            return str(error.reason)
    return f"no alert; the broker sent {data!r}"


async def test_each_principals_certificate_may_write_its_topics_and_no_other(
    mtls_broker: SecureBroker, namespace: str
) -> None:
    """A write the principal's grant names goes through and another is refused by the
    topic's ACL: each certificate is mapped to its own principal, not to a shared or an
    anonymous one."""
    mtls_broker.run("provision", namespace)
    given = mtls_broker.settings_of(Principal.AGENT)
    assert given["KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert Path(given["KAFKA_SSL_CERTFILE"]).name == "agent.pem"
    assert not any(name.startswith("KAFKA_SASL_") for name in given)
    wrong: list[str] = []
    for principal in SERVICE_PRINCIPALS:
        writes = sorted(GRANTS[principal].writes)
        refused_topic = next(topic for topic in Topic if topic not in GRANTS[principal].writes)
        # Not idempotent, as in test_secure_broker.py: a refusal must come from the topic's
        # ACL, not from a missing IdempotentWrite on the cluster.
        prod = AIOKafkaProducer(**mtls_broker.client(principal), acks="all",
                                request_timeout_ms=10_000)
        await prod.start()
        try:
            if writes:
                await (await prod.send(topic_name(writes[0], namespace), b"{}", key=b"k"))
            try:
                await (await prod.send(topic_name(refused_topic, namespace), b"{}", key=b"k"))
                wrong.append(f"{principal} allowed {refused_topic}")
            except TopicAuthorizationFailedError:
                pass
        finally:
            await prod.stop()
    assert not wrong, wrong


@pytest.mark.parametrize("presented", ["no certificate", "a certificate of another CA"])
async def test_a_client_without_the_cas_certificate_fails_the_handshake(
    mtls_broker: SecureBroker, tmp_path: Path, presented: str
) -> None:
    admin = ServiceSettings.model_validate(mtls_broker.settings_of(Principal.ADMIN))
    # The broker is verified the same way in every case; only what the client shows differs.
    context = ssl.create_default_context(cafile=admin.kafka_ssl_cafile)
    if presented != "no certificate":
        # The admin's name and subject, the super user, had the broker trusted its issuer.
        context.load_cert_chain(*client_certificate(tmp_path, Principal.ADMIN))
    bootstrap = admin.kafka_bootstrap_servers
    # The admin's own certificate is let in, so what follows is the certificate's doing.
    assert broker_alert(bootstrap, client_options(admin)["ssl_context"]) is None
    alert = broker_alert(bootstrap, context)
    assert alert is not None
    assert "ALERT" in alert, alert
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL",
                            ssl_context=context, request_timeout_ms=5_000)
    with pytest.raises(KafkaConnectionError):
        await prod.start()
    await prod.stop()

