"""How every Kafka client ClusterWarden makes authenticates and encrypts (docs/security.md).

One home for the connection's security, so the broker of a service, its bulk producer, its
topic admin and the CLI's watcher all connect the same way: plaintext by default, or as the
service's own principal, by SASL/SCRAM over TLS or by its client certificate (mutual TLS).
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.helpers import create_ssl_context
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

from common.settings import ServiceSettings

_SASL_SECURITY: dict[str, type[SASLPlaintext | SASLScram256 | SASLScram512]] = {
    "PLAIN": SASLPlaintext,
    "SCRAM-SHA-256": SASLScram256,
    "SCRAM-SHA-512": SASLScram512,
}


def _tls_context(settings: ServiceSettings) -> ssl.SSLContext | None:
    if not settings.kafka_security_protocol.endswith("SSL"):
        return None
    # Verifies the broker's certificate and its name (check_hostname is on by default).
    context: ssl.SSLContext = create_ssl_context(cafile=settings.kafka_ssl_cafile or None)
    if settings.kafka_ssl_certfile:
        # The client certificate the broker takes the principal from (mTLS). The password is
        # always passed, empty or not: without one, OpenSSL would prompt on the terminal for
        # an encrypted key, and a service has nobody there to answer.
        context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile,
                                settings.kafka_ssl_key_password.get_secret_value())
    return context


def client_options(settings: ServiceSettings) -> dict[str, Any]:
    """Keyword arguments that make an aiokafka producer, consumer or admin client connect to
    the broker `settings` names, authenticated and encrypted as they say."""
    options: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap_servers,
                               "security_protocol": settings.kafka_security_protocol}
    context = _tls_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL_"):
        options |= {"sasl_mechanism": settings.kafka_sasl_mechanism,
                    "sasl_plain_username": settings.kafka_sasl_username,
                    "sasl_plain_password": settings.kafka_sasl_password.get_secret_value()}
    return options


def broker_security(settings: ServiceSettings) -> BaseSecurity | None:
    """The same security as `client_options`, in the form a FastStream broker takes."""
    context = _tls_context(settings)
    if settings.kafka_security_protocol.startswith("SASL_"):
        kind = _SASL_SECURITY[settings.kafka_sasl_mechanism]
        return kind(settings.kafka_sasl_username,
                    settings.kafka_sasl_password.get_secret_value(),
                    ssl_context=context, use_ssl=context is not None)
    if context is not None:
        return BaseSecurity(ssl_context=context)
    return None
