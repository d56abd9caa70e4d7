"""The alerts service's work: record each alert event, then deliver what is due.

The store is the truth: an event is recorded (and committed) before anything is sent, and a
row says what Alertmanager and the webhooks have not heard yet, so a crash or an Alertmanager
that is down loses nothing; the resend loop, which also keeps firing alerts alive in
Alertmanager, delivers it later. Delivery holds the rows it sends (skip-locked), so two
instances never send the same change twice at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from schemas.events.v1 import Alert, now_utc
from services.alerts.delivery import Deliverer, DeliveryFailed
from services.alerts.policy import Change, Outbound, alertmanager_alert, webhook_body
from services.alerts.records import due_for_delivery, record_alert, state_of
from services.alerts.settings import AlertsSettings
from services.store.db import Store, fail_closed
from services.store.models import AlertRecord

log = logging.getLogger("clusterwarden.alerts")


@dataclass(frozen=True)
class Delivered:
    """What one delivery round sent."""

    to_alertmanager: int
    to_webhooks: int
    failed: bool


class AlertsService:
    """Records alert events and delivers alerts."""

    def __init__(self, settings: AlertsSettings, store: Store, deliverer: Deliverer,
                 clock: Callable[[], datetime] = now_utc) -> None:
        self.settings = settings
        self.store = store
        self.deliverer = deliverer
        self.clock = clock
        self.out = Outbound(settings.resend_interval_s, settings.namespace,
                            settings.console_url)

    async def on_alert(self, alert: Alert) -> None:
        async with self.store.session() as session:
            transition = await fail_closed(record_alert(session, alert))
        if transition is None:
            log.info("alert %s/%s: event %s changes nothing", alert.cluster_id,
                     alert.dedup_key, alert.event_id)
            return
        log.warning("alert %s/%s %s (%s): %s", alert.cluster_id, alert.dedup_key,
                    transition.change, alert.severity, alert.message)
        await self.deliver_due()

    async def deliver_due(self) -> Delivered:
        """Send every change not delivered yet and refresh firing alerts (the resend loop)."""
        now = self.clock()
        async with self.store.session() as session:
            rows = await fail_closed(due_for_delivery(session, now,
                                                      self.settings.resend_interval_s))
            if not rows:
                return Delivered(0, 0, failed=False)
            am_failed = await self._to_alertmanager(rows, now)
            hooks, hooks_failed = await self._to_webhooks(
                [row for row in rows if row.webhook_pending], now)
        return Delivered(0 if am_failed else len(rows), hooks, am_failed or hooks_failed)

    async def _to_alertmanager(self, rows: list[AlertRecord], now: datetime) -> bool:
        batch = [alertmanager_alert(state_of(row), now, self.out) for row in rows]
        try:
            await self.deliverer.to_alertmanager(batch)
        except DeliveryFailed as err:
            log.warning("Alertmanager did not take %d alert(s); sent again in %.0f s: %s",
                        len(batch), self.settings.resend_interval_s, err)
            return True
        for row in rows:
            row.delivered_at = now
        return False

    async def _to_webhooks(self, rows: list[AlertRecord], now: datetime) -> tuple[int, bool]:
        sent = 0
        for row in rows:
            change: Change = row.last_change  # type: ignore[assignment]
            try:
                await self.deliverer.to_webhooks(webhook_body(state_of(row), change, now,
                                                              self.out))
            except DeliveryFailed as err:
                log.warning("webhook delivery of %s/%s failed; tried again later: %s",
                            row.cluster_id, row.dedup_key, err)
                return sent, True
            row.webhook_pending = False
            sent += 1
        return sent, False
