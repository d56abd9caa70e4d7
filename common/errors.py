"""How a failure is classified decides what happens to the message that caused it."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from pydantic import ValidationError
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class PermanentError(Exception):
    """The message can never be processed (bad input, unknown node): dead-letter it now."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class TransientError(Exception):
    """Processing may succeed if tried again soon: retry a few times, then dead-letter."""


class InfrastructureUnavailable(Exception):
    """Redis or Kafka cannot be reached: never dead-letter, never ack; fail closed and wait."""


class RedisRefused(ResponseError):
    """Redis answered but refused for a reason of its own state, not of the command: MISCONF
    (its snapshots are failing), BUSY (a script runs too long), NOREPLICAS (too few replicas
    acknowledge writes). The client raises these as a plain reply error, so the connections
    of services/shared/redis_client.py map their codes to this class."""


# Reply codes of a Redis that refuses because of its own state; the client raises a class of
# its own for the others (READONLY, OOM, NOPERM, LOADING, CLUSTERDOWN, MASTERDOWN, TRYAGAIN).
REDIS_REFUSAL_CODES = ("MISCONF", "BUSY", "NOREPLICAS")

# A Redis that answers but refuses is an outage like one that does not answer: a replica left
# behind by a failover (READONLY), memory full (OOM), failing snapshots (MISCONF), a user
# without the permission (NOPERM, a deployment error), a dataset still loading (LOADING) or a
# script holding the server (BUSY). None of them says anything about the message being handled,
# so none may dead-letter it or commit it: the message waits until Redis accepts it again.
REDIS_REFUSALS: tuple[type[BaseException], ...] = (
    ReadOnlyError,
    OutOfMemoryError,
    NoPermissionError,
    BusyLoadingError,
    ClusterDownError,
    TryAgainError,
    RedisRefused,
)

INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    *REDIS_REFUSALS,
    RedisConnectionError,
    RedisTimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
    InfrastructureUnavailable,
    ConnectionError,
    asyncio.TimeoutError,
)


def describe_validation_error(err: ValidationError) -> PermanentError:
    """A ValidationError as a short, stable reason code and a readable detail."""
    errors = err.errors(include_url=False, include_input=False)
    if any(e["loc"][:1] == ("schema_version",) for e in errors):
        return PermanentError("unsupported_version", "schema_version is not supported")
    kinds = sorted({str(e["type"]) for e in errors})
    detail = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors[:5]
    )
    return PermanentError(kinds[0] if len(kinds) == 1 else "invalid", detail[:900])
