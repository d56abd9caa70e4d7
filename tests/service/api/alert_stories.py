"""Alerts in the task store for the API, CLI and console tests, recorded from Alert events
through the alerts service's own records (as the alerts service records them)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from schemas.events.v1 import Alert, now_utc
from services.alerts.records import record_alert
from services.store.db import Store
from tests.contracts.examples import example

FIRING = example("alert", Alert)
# The story's alerts, by (cluster, dedup key).
BREAKER = ("c1", "breaker.c1.offline")
SHORT_CIRCUIT = ("c1", "short-circuit.c1.default")
RESOLVED = ("c2", "breaker.c2.migrate")


def alert(cluster: str, key: str, at: datetime, **update: Any) -> Alert:
    """An Alert event of `cluster` named `key` (the contract's example otherwise)."""
    return FIRING.model_copy(update={"event_id": uuid4(), "occurred_at": at,
                                     "cluster_id": cluster, "dedup_key": key,
                                     "subject": key, **update})


def story(start: datetime | None = None) -> list[Alert]:
    """A breaker open on c1 (raised twice), a short-circuit on c1, and a breaker on c2 that
    opened and was reset: two alerts firing, one resolved."""
    t = start or now_utc() - timedelta(minutes=10)
    return [
        alert(*RESOLVED, t, kind="breaker_open", message="3 failed migrate adjustments"),
        alert(*BREAKER, t + timedelta(minutes=1), kind="breaker_open",
              message="3 failed offline adjustments in the window"),
        alert(*SHORT_CIRCUIT, t + timedelta(minutes=2), kind="short_circuit",
              severity="warning", message="pool default short-circuited: 4 of 10 unhealthy"),
        alert(*BREAKER, t + timedelta(minutes=3), kind="breaker_open",
              message="4 failed offline adjustments in the window"),
        alert(*RESOLVED, t + timedelta(minutes=4), kind="breaker_reset", severity="info",
              status="resolved", message="breaker c2/migrate reset by ada: NFS fixed"),
    ]


async def record(store: Store, events: Iterable[Alert]) -> None:
    """Record `events` in one transaction, as the alerts service does one by one."""
    async with store.session() as session:
        for event in events:
            await record_alert(session, event)
