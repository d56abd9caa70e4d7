"""How a failure is classified decides what happens to the message that caused it."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from pydantic import ValidationError
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


INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
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
