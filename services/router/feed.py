"""The agents' reports, consumed in batches, feed the router's model registry."""

from __future__ import annotations

from typing import Any

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaMessage
from pydantic import ValidationError

from common.deadletter import DeadLetterPolicy, classify, records_of
from common.errors import PermanentError
from common.messaging import parse_event
from common.reportauth import UNAUTHENTICATED, ReportAuthenticator
from schemas.events.v1 import NodeReport
from services.router.registry import Registry


class ReportFeed:
    """The agents' reports, consumed in batches, feed the model registry.

    A report's models decide where ML tasks run, so, as at the collector, a report counts only
    with its node's MAC (common/reportauth.py): a forged report could otherwise announce a
    model on a node that does not serve it, or take one away, and steer tasks.
    """

    def __init__(self, registry: Registry, dead_letters: DeadLetterPolicy,
                 max_message_bytes: int, authenticator: ReportAuthenticator | None = None,
                 *, require_mac: bool = True) -> None:
        self.registry = registry
        self.dead_letters = dead_letters
        self.max_message_bytes = max_message_bytes
        self.authenticator = authenticator
        self.require_mac = require_mac

    async def on_reports(self, bodies: list[bytes], msg: KafkaMessage) -> None:
        """A batch of raw reports: each one validated on its own, the valid ones applied to
        the registry in one round trip, the invalid ones dead-lettered."""
        reports: list[NodeReport] = []
        invalid: list[tuple[ConsumerRecord[Any, Any], str, str]] = []
        for item in records_of(msg.raw_message):
            try:
                report = parse_event(NodeReport, item.value or b"", item.key,
                                     self.max_message_bytes)
            except (PermanentError, ValidationError) as err:
                _, reason, detail = classify(err)
                invalid.append((item, reason, detail))
                continue
            refusal = None if self.authenticator is None else self.authenticator.check(
                report.cluster_id, report.node_id, item.value or b"", item.headers or (),
                required=self.require_mac)
            if refusal is not None:
                # The collector alerts a person once per node; the router only keeps it out.
                invalid.append((item, UNAUTHENTICATED, refusal))
                continue
            reports.append(report)
        # Applied first: if Redis is down the batch comes again (applying it twice changes
        # nothing) without having dead-lettered its invalid items once per delivery.
        await self.registry.apply(reports)
        for item, reason, detail in invalid:
            await self.dead_letters.dead_letter(item, reason, detail)
