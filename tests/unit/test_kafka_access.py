"""The Kafka connection settings and the access table (docs/security.md), as pure code."""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError

from common.kafka_access import broker_security, client_options
from common.settings import ServiceSettings
from schemas.access import GRANTS, SERVICE_PRINCIPALS, Principal, acl_rules, writers
from schemas.topics import Topic, dead_letter_name, topic_name


def test_plaintext_is_the_default_and_carries_no_credentials() -> None:
    settings = ServiceSettings()
    assert client_options(settings) == {"bootstrap_servers": settings.kafka_bootstrap_servers,
                                        "security_protocol": "PLAINTEXT"}
    assert broker_security(settings) is None


def test_sasl_over_tls_carries_the_principal_and_verifies_the_broker() -> None:
    settings = ServiceSettings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="agent",
                               kafka_sasl_password="secret")
    options = client_options(settings)
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "agent", "secret")
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    security = broker_security(settings)
    assert security is not None
    assert security.use_ssl


@pytest.mark.parametrize("password", ["", None])
def test_sasl_without_credentials_is_refused_at_start_up(password: str | None) -> None:
    given = {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "agent"}
    if password is not None:
        given["kafka_sasl_password"] = password
    with pytest.raises(ValidationError, match="KAFKA_SASL_PASSWORD"):
        ServiceSettings.model_validate(given)


def test_the_password_never_shows_in_the_settings_repr() -> None:
    settings = ServiceSettings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="agent",
                               kafka_sasl_password="secret")
    assert "secret" not in repr(settings)


@pytest.mark.parametrize(("topic", "only"), [
    (Topic.NODE_COMMANDS, {Principal.EXECUTOR, Principal.ROUTER, Principal.COLLECTOR}),
    (Topic.OPS_TASK_CONTROL, {Principal.API}),
    (Topic.OPS_TASKS_SCHEDULED, {Principal.SCHEDULER}),
    (Topic.NODE_REPORTS, {Principal.AGENT}),
    (Topic.NODE_COMMAND_RESULTS, {Principal.AGENT}),
    (Topic.OPS_POOL_HEALTH, {Principal.ANALYZER}),
])
def test_only_its_producers_may_write_a_topic(topic: Topic, only: set[Principal]) -> None:
    assert writers(topic) == only


def test_agents_write_reports_and_results_and_read_commands_only() -> None:
    grant = GRANTS[Principal.AGENT]
    assert grant.writes == {Topic.NODE_REPORTS, Topic.NODE_COMMAND_RESULTS}
    assert grant.reads == {Topic.NODE_COMMANDS}


def test_every_topic_has_a_writer_and_a_reader_and_each_service_a_user() -> None:
    assert all(writers(topic) for topic in Topic)
    read = {topic for grant in GRANTS.values() for topic in grant.reads}
    assert read == set(Topic)
    assert set(GRANTS) == set(Principal)
    assert Principal.ADMIN not in SERVICE_PRINCIPALS


def test_a_reader_may_write_its_dead_letters_and_nothing_else_of_the_topic() -> None:
    rules = acl_rules("ns")
    wire = topic_name(Topic.NODE_COMMANDS, "ns")
    agent = {(r.resource, r.operation) for r in rules if r.principal is Principal.AGENT}
    assert (dead_letter_name(wire), "Write") in agent
    assert (wire, "Read") in agent
    assert (wire, "Write") not in agent
    assert ("ns.agent", "Read") in agent  # its consumer groups: ns.agent-<cluster>-<node>


def test_a_principal_that_writes_nothing_may_only_take_a_producer_id() -> None:
    # Its idempotent producer asks for an id at start, which needs some right to write.
    rules = [r for r in acl_rules("ns") if r.principal is Principal.INVENTORY]
    assert [(r.kind, r.resource, r.operation) for r in rules] == [
        ("Cluster", "kafka-cluster", "IdempotentWrite")]
