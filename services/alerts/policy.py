"""What an alert event does to the alert it names, and what Alertmanager is told: pure.

One alert per (cluster, dedup key). A `firing` event raises it (or, while it fires, counts one
more occurrence); a `resolved` event ends it; a firing event after the end raises it again as a
new episode (a new start, the acknowledgement cleared). An event older than the alert's last
change, or one seen before, changes nothing: two producers (the scheduler raising a breaker,
the API resetting it) can reach the alerts service in either order.

Alertmanager's conventions (docs/alerts.md): labels identify an alert, so they hold only what
never changes while it fires (alertname = kind, cluster, severity, dedup_key); a firing alert
carries an `endsAt` a few resend intervals ahead, as Prometheus does, and is sent again before
then, so an alert whose sender died resolves by itself instead of firing forever.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from schemas.events.v1 import Alert, AlertStatus

# Prometheus sends a firing alert with endsAt = now + 4 x its resend delay.
ENDS_AT_RESENDS = 4

Change = Literal["raised", "repeated", "resolved", "raised_again", "acknowledged"]


@dataclass(frozen=True)
class AlertState:
    """One alert as the store keeps it."""

    cluster_id: str
    dedup_key: str
    kind: str
    severity: str
    status: AlertStatus
    subject: str
    source: str
    message: str
    resolution: str | None
    starts_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    last_event_id: UUID
    occurrences: int
    acknowledged_by: str | None = None
    acknowledged_at: datetime | None = None
    ack_reason: str | None = None


@dataclass(frozen=True)
class Transition:
    """The alert after an event, and what changed (a person or a tool hears of every one)."""

    state: AlertState
    change: Change


def _raised(alert: Alert) -> AlertState:
    return AlertState(
        cluster_id=alert.cluster_id, dedup_key=alert.dedup_key, kind=alert.kind,
        severity=alert.severity, status=alert.status, subject=alert.subject,
        source=alert.source, message=alert.message,
        resolution=alert.message if alert.status == "resolved" else None,
        starts_at=alert.occurred_at, updated_at=alert.occurred_at,
        resolved_at=alert.occurred_at if alert.status == "resolved" else None,
        last_event_id=alert.event_id, occurrences=1 if alert.status == "firing" else 0,
    )


def apply(current: AlertState | None, alert: Alert) -> Transition | None:
    """The alert after `alert`; None if the event changes nothing (a replay, or stale)."""
    if current is None:
        state = _raised(alert)
        return Transition(state, "raised" if alert.status == "firing" else "resolved")
    if alert.event_id == current.last_event_id or alert.occurred_at < current.updated_at:
        return None
    at, event_id = alert.occurred_at, alert.event_id
    if alert.status == "resolved":
        if current.status == "resolved":
            return None
        return Transition(replace(current, status="resolved", resolution=alert.message,
                                  resolved_at=at, updated_at=at, last_event_id=event_id),
                          "resolved")
    if current.status == "resolved":
        # A new episode: who acknowledged the last one has not seen this one.
        return Transition(_raised(alert), "raised_again")
    # Still firing: the labels stay those it was raised with (Alertmanager knows it by them).
    return Transition(replace(current, message=alert.message, updated_at=at,
                              last_event_id=event_id, occurrences=current.occurrences + 1),
                      "repeated")


def acknowledge(current: AlertState, actor: str, reason: str, now: datetime) -> AlertState:
    """`actor` has seen the alert; it keeps firing until its cause ends."""
    return replace(current, acknowledged_by=actor, acknowledged_at=now, ack_reason=reason)


@dataclass(frozen=True)
class Outbound:
    """How alerts are told to the outside: the resend interval (which sets a firing alert's
    endsAt), the deployment (a `namespace` label, so deployments can share an Alertmanager)
    and the console each alert links to."""

    resend_s: float
    namespace: str = ""
    console_url: str = ""


def labels(state: AlertState, out: Outbound) -> dict[str, str]:
    """What identifies the alert to Alertmanager (grouped by alertname and cluster)."""
    named = {"alertname": state.kind, "cluster": state.cluster_id, "severity": state.severity,
             "dedup_key": state.dedup_key, "service": "clusterwarden"}
    if out.namespace:
        named["namespace"] = out.namespace
    return named


def alertmanager_alert(state: AlertState, now: datetime, out: Outbound) -> dict[str, Any]:
    """The alert as Alertmanager's API v2 (`POST /api/v2/alerts`) takes it."""
    annotations = {"summary": state.message, "subject": state.subject,
                   "source": state.source, "occurrences": str(state.occurrences)}
    if state.resolution is not None:
        annotations["resolution"] = state.resolution
    if state.acknowledged_by is not None:
        annotations["acknowledged_by"] = state.acknowledged_by
        annotations["ack_reason"] = state.ack_reason or ""
    ends_at = (state.resolved_at if state.resolved_at is not None
               else now + timedelta(seconds=ENDS_AT_RESENDS * out.resend_s))
    body: dict[str, Any] = {
        "labels": labels(state, out), "annotations": annotations,
        "startsAt": _rfc3339(state.starts_at), "endsAt": _rfc3339(ends_at),
    }
    if out.console_url:
        body["generatorURL"] = f"{out.console_url.rstrip('/')}/#alerts"
    return body


def webhook_body(state: AlertState, change: Change, now: datetime,
                 out: Outbound) -> dict[str, Any]:
    """A change as Alertmanager's own webhook sends it (version 4), so tools that already
    read Alertmanager's webhooks read ClusterWarden's, with `change` saying what happened."""
    alert = alertmanager_alert(state, now, out)
    alert["status"] = state.status
    alert["fingerprint"] = f"{state.cluster_id}/{state.dedup_key}"
    group = {"alertname": state.kind, "cluster": state.cluster_id}
    return {
        "version": "4", "receiver": "clusterwarden", "status": state.status,
        "groupKey": f"{group['cluster']}/{group['alertname']}", "truncatedAlerts": 0,
        "groupLabels": group, "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"], "externalURL": out.console_url,
        "alerts": [alert], "change": change,
    }


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
