"""Settings every service shares; each service subclasses with its own env prefix."""

from typing import Literal, Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.envelope import CLUSTER_ID_PATTERN

# The bound of one Redis call (connect, then the reply): a stalled Redis fails a handler within
# it, and the message waits, instead of hanging its partition (services/shared/redis_client.py).
REDIS_CALL_BOUND_S = 5.0
DEFAULT_REDIS_CONNECT_TIMEOUT_S = 2.0
DEFAULT_REDIS_READ_TIMEOUT_S = 3.0
# HMAC-SHA256 wants a key at least as long as its output: a shorter one is easier to guess.
AUDIT_KEY_MIN_CHARS = 32


class ServiceSettings(BaseSettings):
    """Connection and namespace settings, read from the environment."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:19092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "kafka_bootstrap_servers"),
    )
    # Plaintext by default (the local demo and tests); a secured broker (docs/security.md)
    # takes SASL_SSL with this service's own principal and the CA that signed the broker.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        validation_alias=AliasChoices("KAFKA_SECURITY_PROTOCOL", "kafka_security_protocol"),
    )
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        default="SCRAM-SHA-512",
        validation_alias=AliasChoices("KAFKA_SASL_MECHANISM", "kafka_sasl_mechanism"),
    )
    kafka_sasl_username: str = Field(
        default="",
        validation_alias=AliasChoices("KAFKA_SASL_USERNAME", "kafka_sasl_username"),
    )
    kafka_sasl_password: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("KAFKA_SASL_PASSWORD", "kafka_sasl_password"),
    )
    kafka_ssl_cafile: str = Field(
        default="",
        validation_alias=AliasChoices("KAFKA_SSL_CAFILE", "kafka_ssl_cafile"),
        description="PEM file of the CA that signed the broker's certificate; empty: the system's.",
    )
    # Mutual TLS (docs/security.md): with KAFKA_SECURITY_PROTOCOL=SSL the client certificate
    # is the service's principal, as the SASL username is with SASL_SSL.
    kafka_ssl_certfile: str = Field(
        default="",
        validation_alias=AliasChoices("KAFKA_SSL_CERTFILE", "kafka_ssl_certfile"),
        description="PEM file of this service's client certificate (its principal); needed "
                    "with KAFKA_SECURITY_PROTOCOL=SSL.",
    )
    kafka_ssl_keyfile: str = Field(
        default="",
        validation_alias=AliasChoices("KAFKA_SSL_KEYFILE", "kafka_ssl_keyfile"),
        description="PEM file of the client certificate's private key.",
    )
    kafka_ssl_key_password: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("KAFKA_SSL_KEY_PASSWORD", "kafka_ssl_key_password"),
        description="Password of an encrypted KAFKA_SSL_KEYFILE; empty: the key is not "
                    "encrypted.",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:16379/0",
        validation_alias=AliasChoices("REDIS_URL", "redis_url"),
    )
    redis_connect_timeout_s: float = Field(
        default=DEFAULT_REDIS_CONNECT_TIMEOUT_S,
        gt=0,
        validation_alias=AliasChoices("WARDEN_REDIS_CONNECT_TIMEOUT_S", "redis_connect_timeout_s"),
        description="How long a Redis call waits for a connection.",
    )
    redis_read_timeout_s: float = Field(
        default=DEFAULT_REDIS_READ_TIMEOUT_S,
        gt=0,
        validation_alias=AliasChoices("WARDEN_REDIS_READ_TIMEOUT_S", "redis_read_timeout_s"),
        description="How long a Redis call waits for its reply; with the connect timeout at "
                    "most 5 s.",
    )
    namespace: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_-]{0,64}$",
        validation_alias=AliasChoices("WARDEN_NAMESPACE", "namespace"),
        description="Prefix of every topic and Redis key; one per test run or deployment.",
    )
    cluster_id: str = Field(
        default="local",
        pattern=CLUSTER_ID_PATTERN,
        validation_alias=AliasChoices("WARDEN_CLUSTER_ID", "cluster_id"),
    )
    max_message_bytes: int = Field(
        default=65_536,
        ge=1_024,
        le=1_048_576,
        validation_alias=AliasChoices("WARDEN_MAX_MESSAGE_BYTES", "max_message_bytes"),
        description="Larger messages are dead-lettered before parsing.",
    )
    state_dir: str = Field(
        default=".state",
        validation_alias=AliasChoices("WARDEN_STATE_DIR", "state_dir"),
    )
    outbox_grace_s: float = Field(
        default=30.0,
        gt=0,
        le=3_600,
        validation_alias=AliasChoices("WARDEN_OUTBOX_GRACE_S", "outbox_grace_s"),
        description="An event written with its state change and still unpublished after this "
                    "is published by the outbox relay (services/shared/outbox.py): longer than "
                    "a publish takes while the broker is slow, or it goes out twice.",
    )
    # The health endpoints of a FastStream service (common/health, docs/helm.md).
    # Off by default: the demo and the tests run many services on one machine, and one port
    # for all would collide; a pod has one service and turns them on.
    health_port: int = Field(
        default=0,
        ge=0,
        le=65_535,
        validation_alias=AliasChoices("WARDEN_HEALTH_PORT", "health_port"),
        description="Port of /livez and /readyz; 0: not served.",
    )
    health_host: str = Field(
        default="127.0.0.1",
        validation_alias=AliasChoices("WARDEN_HEALTH_HOST", "health_host"),
        description="Listen address of the health endpoints (0.0.0.0 in a pod, for the kubelet).",
    )
    health_check_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=30,
        validation_alias=AliasChoices("WARDEN_HEALTH_CHECK_TIMEOUT_S", "health_check_timeout_s"),
        description="How long /readyz waits for each dependency (they are asked at once).",
    )

    # The audit chains' heads carry an HMAC under this key (services/shared/audit.py), so
    # whoever can write Redis or the store but does not hold it cannot cut the log and
    # rewrite the head to match. Every process that appends or verifies must hold the same.
    audit_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("WARDEN_AUDIT_KEY", "audit_key"),
        description=f"The secret the audit chains' heads are keyed with (at least "
                    f"{AUDIT_KEY_MIN_CHARS} characters); empty: <state_dir>/keys/audit.key "
                    "(made if missing, which only processes sharing a state folder share).",
    )

    @model_validator(mode="after")
    def _audit_key_long_enough(self) -> Self:
        # Refused at start-up, not at the first append: a short key is a configuration slip.
        given = self.audit_key.get_secret_value()
        if given and len(given) < AUDIT_KEY_MIN_CHARS:
            raise ValueError(f"WARDEN_AUDIT_KEY must be at least {AUDIT_KEY_MIN_CHARS} "
                             "characters (e.g. `openssl rand -base64 32`)")
        return self

    @model_validator(mode="after")
    def _redis_calls_bounded(self) -> Self:
        if self.redis_connect_timeout_s + self.redis_read_timeout_s > REDIS_CALL_BOUND_S:
            raise ValueError(f"redis_connect_timeout_s + redis_read_timeout_s must be at most "
                             f"{REDIS_CALL_BOUND_S:g} s")
        return self

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> Self:
        # Refused at start-up: an empty password would only fail later, as an opaque
        # authentication error on the first connection.
        if self.kafka_security_protocol.startswith("SASL_") and not (
                self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()):
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs "
                             "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
        return self

    @model_validator(mode="after")
    def _ssl_needs_a_client_certificate(self) -> Self:
        # Plain SSL authenticates the client by its certificate alone: without one the broker
        # (ssl.client.auth=required) drops every connection at the handshake, which a service
        # would only report as a broker it cannot reach. Refused here, at start-up, instead.
        protocol = self.kafka_security_protocol
        cert, key = bool(self.kafka_ssl_certfile), bool(self.kafka_ssl_keyfile)
        if protocol == "SSL" and not (cert and key):
            raise ValueError("KAFKA_SECURITY_PROTOCOL=SSL needs KAFKA_SSL_CERTFILE and "
                             "KAFKA_SSL_KEYFILE: the client certificate and key that are this "
                             "service's principal")
        if cert != key:
            raise ValueError("KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE are set together or "
                             "not at all")
        # A certificate given to a connection without TLS would be silently unused: the
        # service would run plaintext while its operator believes it authenticated.
        if cert and not protocol.endswith("SSL"):
            raise ValueError(f"KAFKA_SSL_CERTFILE is set but KAFKA_SECURITY_PROTOCOL={protocol} "
                             "has no TLS to present it on (SSL or SASL_SSL)")
        return self


class ReportReaderSettings(ServiceSettings):
    """Settings of a service that reads the agents' reports and so checks their MACs."""

    require_report_mac: bool = Field(
        default=True,
        validation_alias=AliasChoices("WARDEN_REQUIRE_REPORT_MAC", "COLLECTOR_REQUIRE_REPORT_MAC",
                                      "require_report_mac"),
        description="Reports must carry their node's MAC (report-mac, report-kid headers) for "
        "the collector and the router to read them; off only while old agents that cannot sign "
        "are upgraded (a MAC that is there is still checked).")
    report_master_key: str = Field(
        default="",
        validation_alias=AliasChoices("WARDEN_REPORT_MASTER_KEY", "COLLECTOR_REPORT_MASTER_KEY",
                                      "report_master_key"),
        description="The secret node report keys are derived from; empty: "
        "<state_dir>/keys/report-master.key (made if missing).")
    report_retired_master_keys: str = Field(
        default="",
        validation_alias=AliasChoices("WARDEN_REPORT_RETIRED_MASTER_KEYS",
                                      "report_retired_master_keys"),
        description="Comma-separated files of earlier report masters, still accepted while "
        "nodes move to keys of the current one (a rotation); empty: none.")
