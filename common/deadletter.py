"""Dead-letter middleware: what cannot be processed goes to `<topic>.dlt` with the reason.

FastStream's Kafka defaults are unsafe for a control plane: ACK_FIRST loses messages, and
NACK_ON_ERROR alone redelivers a poison message forever and stalls its partition. Every
subscriber here uses NACK_ON_ERROR (commit after processing) plus this middleware, which
decides per failure:

* permanent error (bad input, unknown node, any unexpected bug): publish the original bytes
  to the dead-letter topic with the original topic/partition/offset and the error in
  headers, then let the message be committed;
* transient error: retry in process with backoff (1, 2, 4 s), then dead-letter;
* infrastructure unavailable (Redis or Kafka down): never dead-letter and never commit;
  back off and let the message be delivered again (fail closed).

If publishing the dead letter itself fails, the message is not committed either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiokafka.structs import ConsumerRecord
from faststream import BaseMiddleware
from pydantic import ValidationError

from common.errors import (
    INFRASTRUCTURE_ERRORS,
    PermanentError,
    TransientError,
    describe_validation_error,
)
from schemas.topics import dead_letter_name

if TYPE_CHECKING:
    from faststream._internal.context.repository import ContextRepo
    from faststream.message import StreamMessage

log = logging.getLogger("clusterwarden.deadletter")

DeadLetterPublisher = Callable[[str, bytes | None, bytes, dict[str, str]], Awaitable[None]]


def classify(exc: BaseException) -> tuple[str, str, str]:
    """(disposition, reason, detail) for an exception; disposition is dead_letter or wait."""
    if isinstance(exc, ValidationError):
        exc = describe_validation_error(exc)
    if isinstance(exc, PermanentError):
        return "dead_letter", exc.reason, exc.detail
    # A component's own error raised from an outage (a store that could not read Redis) is
    # the outage: wait for it to end instead of dead-lettering a good message.
    if isinstance(exc, INFRASTRUCTURE_ERRORS) or isinstance(exc.__cause__, INFRASTRUCTURE_ERRORS):
        return "wait", "infrastructure_unavailable", repr(exc)[:900]
    if isinstance(exc, TransientError):
        return "dead_letter", "retries_exhausted", repr(exc)[:900]
    # An unexpected exception is a bug or an input we did not foresee; stalling the partition
    # would stop the whole control plane for one message, so it is dead-lettered, loudly.
    return "dead_letter", "unhandled_error", f"{type(exc).__name__}: {exc}"[:900]


def dead_letter_headers(record: ConsumerRecord[Any, Any], reason: str, detail: str,
                        group: str) -> dict[str, str]:
    """The Spring-Kafka-style headers that let an operator find and replay the original."""
    return {
        "dlt-original-topic": record.topic,
        "dlt-original-partition": str(record.partition),
        "dlt-original-offset": str(record.offset),
        "dlt-original-timestamp": str(record.timestamp),
        "dlt-consumer-group": group,
        "dlt-reason": reason,
        "dlt-error": detail.replace("\n", " ")[:900],
    }


def records_of(raw: Any) -> Sequence[ConsumerRecord[Any, Any]]:
    """The consumer records behind a raw message (one, or a batch)."""
    if isinstance(raw, tuple | list):
        return list(raw)
    return [raw]


class DeadLetterPolicy:
    """Builds one middleware per message; holds the publisher and the retry schedule."""

    def __init__(
        self,
        group: str,
        publish: DeadLetterPublisher,
        retry_delays_s: Sequence[float] = (1.0, 2.0, 4.0),
        wait_delay_s: float = 2.0,
        on_dead_letter: Callable[[str], None] | None = None,
    ) -> None:
        self.group = group
        self.publish = publish
        self.retry_delays_s = tuple(retry_delays_s)
        self.wait_delay_s = wait_delay_s
        self.on_dead_letter = on_dead_letter

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _DeadLetterMiddleware:
        return _DeadLetterMiddleware(msg, context=context, policy=self)

    async def dead_letter(self, raw: Any, reason: str, detail: str) -> None:
        """Publish every record of `raw` to its dead-letter topic, awaiting the broker's ack."""
        for record in records_of(raw):
            headers = dead_letter_headers(record, reason, detail, self.group)
            await self.publish(dead_letter_name(record.topic), record.key, record.value or b"",
                               headers)
            log.warning("dead-lettered %s[%s]@%s: %s %s", record.topic, record.partition,
                        record.offset, reason, detail[:200])
            if self.on_dead_letter is not None:
                self.on_dead_letter(reason)


class _DeadLetterMiddleware(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: ContextRepo, policy: DeadLetterPolicy) -> None:
        super().__init__(msg, context=context)
        self.policy = policy

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        for delay in self.policy.retry_delays_s:
            try:
                return await call_next(msg)
            except TransientError as err:
                log.info("transient error, retrying in %.1fs: %r", delay, err)
                await asyncio.sleep(delay)
        return await call_next(msg)

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        if exc_val is None or isinstance(exc_val, asyncio.CancelledError):
            return False
        if not isinstance(exc_val, Exception):
            return False
        disposition, reason, detail = classify(exc_val)
        if disposition == "wait":
            log.warning("infrastructure unavailable, not committing: %s", detail[:200])
            await asyncio.sleep(self.policy.wait_delay_s)
            return False
        if reason == "unhandled_error":
            log.error("unhandled error in handler", exc_info=exc_val)
        try:
            await self.policy.dead_letter(self.msg, reason, detail)
        except Exception:
            log.exception("dead-letter publish failed; the message will be delivered again")
            await asyncio.sleep(self.policy.wait_delay_s)
            return False
        return True  # handled: the acknowledgement middleware commits the offset
