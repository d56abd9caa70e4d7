"""The settings of mutual TLS to Kafka (docs/security.md): the client certificate is the
principal, so SSL without one is refused at start-up, and the connection presents it."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from faststream.security import BaseSecurity
from pydantic import ValidationError

from common.kafka_access import broker_security, client_options
from common.settings import ServiceSettings
from tests.tls import client_certificate


@pytest.mark.parametrize("given", [{}, {"kafka_ssl_certfile": "agent.pem"},
                                   {"kafka_ssl_keyfile": "agent.key"}])
def test_ssl_without_a_certificate_and_its_key_is_refused_at_start_up(
    given: dict[str, str]
) -> None:
    with pytest.raises(ValidationError, match="SSL needs KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE"):
        ServiceSettings.model_validate({"kafka_security_protocol": "SSL", **given})


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_a_certificate_on_a_connection_without_tls_is_refused(protocol: str) -> None:
    given = {"kafka_security_protocol": protocol, "kafka_ssl_certfile": "agent.pem",
             "kafka_ssl_keyfile": "agent.key", "kafka_sasl_username": "agent",
             "kafka_sasl_password": "secret"}
    with pytest.raises(ValidationError, match="no TLS to present it on"):
        ServiceSettings.model_validate(given)


def test_a_certificate_without_its_key_is_refused_with_sasl_too() -> None:
    with pytest.raises(ValidationError, match="set together"):
        ServiceSettings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="agent",
                        kafka_sasl_password="secret", kafka_ssl_certfile="agent.pem")


def test_the_environment_names_the_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": "a.pem",
                        "KAFKA_SSL_KEYFILE": "a.key", "KAFKA_SSL_KEY_PASSWORD": "pw"}.items():
        monkeypatch.setenv(name, value)
    settings = ServiceSettings()
    assert (settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile) == ("a.pem", "a.key")
    assert "pw" not in repr(settings)


@pytest.mark.parametrize("key_password", ["", "key-secret"])
def test_ssl_presents_the_certificate_and_verifies_the_broker(
    tmp_path: Path, key_password: str
) -> None:
    cert, key = client_certificate(tmp_path, "agent", key_password)
    settings = ServiceSettings(kafka_security_protocol="SSL", kafka_ssl_certfile=str(cert),
                               kafka_ssl_keyfile=str(key), kafka_ssl_key_password=key_password)
    options = client_options(settings)
    assert options["security_protocol"] == "SSL"
    assert not any(name.startswith("sasl_") for name in options)
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    # FastStream's broker takes a plain BaseSecurity with the context as SSL.
    security = broker_security(settings)
    assert type(security) is BaseSecurity
    assert security.use_ssl
    assert isinstance(security.ssl_context, ssl.SSLContext)


def test_a_key_that_is_not_the_certificates_stops_the_client(tmp_path: Path) -> None:
    # The pair is loaded when the client is made, so a wrong key fails there, with OpenSSL's
    # reason, and never as a broker that refuses every connection.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, _ = client_certificate(tmp_path / "a", "agent")
    _, other_key = client_certificate(tmp_path / "b", "agent")
    settings = ServiceSettings(kafka_security_protocol="SSL", kafka_ssl_certfile=str(cert),
                               kafka_ssl_keyfile=str(other_key))
    with pytest.raises(ssl.SSLError):
        client_options(settings)


def test_an_encrypted_key_without_its_password_fails_and_never_prompts(tmp_path: Path) -> None:
    cert, key = client_certificate(tmp_path, "agent", "key-secret")
    settings = ServiceSettings(kafka_security_protocol="SSL", kafka_ssl_certfile=str(cert),
                               kafka_ssl_keyfile=str(key))
    with pytest.raises(ssl.SSLError):
        client_options(settings)
