"""The alerts service on a real task store (SQLite and PostgreSQL) and real HTTP receivers:
each alert recorded once, delivered to Alertmanager's API and the webhooks (signed), what
could not be delivered sent again later, firing alerts kept alive, acknowledgements told."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from schemas.events.v1 import Alert
from services.alerts.delivery import SIGNATURE_HEADER, Deliverer, signature
from services.alerts.handlers import AlertsService
from services.alerts.records import acknowledge_alert, list_alerts
from services.alerts.settings import AlertsSettings
from services.store.db import Store
from tests.contracts.examples import T0, example

FIRING = example("alert", Alert)
SECRET = "s3cret"


@dataclass
class Receiver:
    """A real HTTP server on loopback that keeps what it is sent (and can refuse it)."""

    port: int = 0
    status: int = 200
    posts: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request, *lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines
                                                        if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.posts.append((request.split()[1], headers, body))
        writer.write(f"HTTP/1.1 {self.status} X\r\ncontent-length: 0\r\n"
                     "connection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str) -> list[Any]:
        return [json.loads(body) for got, _, body in self.posts if got == path]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver()
    server = await asyncio.start_server(got.handle, "127.0.0.1", 0)
    got.port = server.sockets[0].getsockname()[1]
    async with server:
        yield got


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def service(store: Store, receiver: Receiver, clock: Clock) -> AlertsService:
    settings = AlertsSettings(alertmanager_url=receiver.url(""), namespace="t1",
                              webhook_urls=[receiver.url("/hook")], webhook_secret=SECRET,
                              resend_interval_s=60.0, database_url="sqlite+aiosqlite://")
    deliverer = Deliverer(settings.alertmanager_url, settings.webhook_urls, SECRET, 5.0)
    return AlertsService(settings, store, deliverer, clock)


async def test_an_alert_is_recorded_once_and_delivered_with_its_webhook_signed(
    store: Store, receiver: Receiver
) -> None:
    alerts = service(store, receiver, Clock())
    await alerts.on_alert(FIRING)
    await alerts.on_alert(FIRING)  # redelivered: nothing new
    (sent,) = receiver.bodies("/api/v2/alerts")
    assert [a["labels"]["dedup_key"] for a in sent] == ["breaker.local.offline"]
    assert sent[0]["labels"]["namespace"] == "t1"
    ((_, headers, raw),) = [p for p in receiver.posts if p[0] == "/hook"]
    assert headers[SIGNATURE_HEADER.lower()] == signature(SECRET, raw)
    assert json.loads(raw)["change"] == "raised"
    async with store.session() as session:
        rows, total = await list_alerts(session, "firing", None, 10, 0)
    assert total == 1
    assert rows[0].delivered_at == T0
    assert rows[0].occurrences == 1


async def test_what_alertmanager_refused_is_sent_again_and_firing_alerts_are_refreshed(
    store: Store, receiver: Receiver
) -> None:
    clock = Clock()
    alerts = service(store, receiver, clock)
    receiver.status = 503
    await alerts.on_alert(FIRING)
    async with store.session() as session:
        rows, _ = await list_alerts(session, None, None, 10, 0)
    assert rows[0].delivered_at is None  # not lost: still to be sent

    receiver.status = 200
    clock.now = T0 + timedelta(seconds=5)
    delivered = await alerts.deliver_due()
    assert (delivered.to_alertmanager, delivered.to_webhooks, delivered.failed) == (1, 1, False)
    assert (await alerts.deliver_due()).to_alertmanager == 0  # nothing due yet

    clock.now = T0 + timedelta(seconds=70)  # a resend interval later: its endsAt moves on
    assert (await alerts.deliver_due()).to_alertmanager == 1
    last = receiver.bodies("/api/v2/alerts")[-1][0]
    assert last["endsAt"] == (clock.now + timedelta(seconds=240)).isoformat().replace(
        "+00:00", "Z")
    assert (await alerts.deliver_due()).to_webhooks == 0  # a resend is no change


async def test_a_resolution_and_an_acknowledgement_are_told(
    store: Store, receiver: Receiver
) -> None:
    clock = Clock()
    alerts = service(store, receiver, clock)
    await alerts.on_alert(FIRING)
    async with store.session() as session:
        acked = await acknowledge_alert(session, "local", "breaker.local.offline", "bob",
                                        "on it", T0)
        missing = await acknowledge_alert(session, "local", "no-such", "bob", "x", T0)
    assert missing is None
    assert acked is not None
    assert acked.acknowledged_by == "bob"
    await alerts.deliver_due()
    assert receiver.bodies("/hook")[-1]["change"] == "acknowledged"
    assert receiver.bodies("/api/v2/alerts")[-1][0]["annotations"]["acknowledged_by"] == "bob"

    resolved = FIRING.model_copy(update={
        "event_id": uuid4(), "occurred_at": T0 + timedelta(seconds=30), "status": "resolved",
        "severity": "info", "kind": "breaker_reset", "message": "reset by alice"})
    await alerts.on_alert(resolved)
    last = receiver.bodies("/api/v2/alerts")[-1][0]
    assert last["endsAt"] == resolved.occurred_at.isoformat().replace("+00:00", "Z")
    assert last["labels"]["alertname"] == "breaker_open"  # the same alert, ended
    assert receiver.bodies("/hook")[-1]["status"] == "resolved"
    async with store.session() as session:
        rows, total = await list_alerts(session, "resolved", "local", 10, 0)
    assert total == 1
    assert rows[0].resolution == "reset by alice"
