"""An alert's life from its events (raised, repeated, resolved, raised again) and what
Alertmanager and the webhooks are told: pure."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import uuid4

from schemas.events.v1 import Alert
from services.alerts.policy import (
    ENDS_AT_RESENDS,
    AlertState,
    Outbound,
    acknowledge,
    alertmanager_alert,
    apply,
    labels,
    webhook_body,
)
from tests.contracts.examples import T0, example

FIRING = example("alert", Alert)
OUT = Outbound(resend_s=60.0, namespace="prod", console_url="https://warden.example/")


def event(at_s: float, **update: Any) -> Alert:
    return FIRING.model_copy(update={"event_id": uuid4(),
                                     "occurred_at": T0 + timedelta(seconds=at_s), **update})


def raised() -> AlertState:
    transition = apply(None, FIRING)
    assert transition is not None
    return transition.state


def test_a_first_firing_event_raises_the_alert() -> None:
    transition = apply(None, FIRING)
    assert transition is not None
    state = transition.state
    assert transition.change == "raised"
    assert (state.status, state.starts_at, state.occurrences, state.resolved_at) == (
        "firing", T0, 1, None)
    assert (state.kind, state.severity, state.dedup_key) == (
        "breaker_open", "critical", "breaker.local.offline")


def test_a_repeat_counts_and_keeps_the_labels_it_was_raised_with() -> None:
    repeat = event(5, severity="warning", message="still failing")
    transition = apply(raised(), repeat)
    assert transition is not None
    assert transition.change == "repeated"
    state = transition.state
    assert (state.occurrences, state.message, state.starts_at, state.updated_at) == (
        2, "still failing", T0, repeat.occurred_at)
    assert labels(state, OUT) == labels(raised(), OUT)


def test_a_resolution_ends_it_and_later_firing_raises_a_new_episode() -> None:
    resolving = event(30, status="resolved", severity="info", kind="breaker_reset",
                      message="reset by alice: fixed")
    ended = apply(raised(), resolving)
    assert ended is not None
    assert ended.change == "resolved"
    assert (ended.state.status, ended.state.resolved_at, ended.state.resolution) == (
        "resolved", resolving.occurred_at, "reset by alice: fixed")
    # Still the breaker's alert: kind and severity are those it fired with.
    assert (ended.state.kind, ended.state.severity) == ("breaker_open", "critical")
    acked = acknowledge(ended.state, "bob", "looking", T0)

    again = apply(acked, event(60))
    assert again is not None
    assert again.change == "raised_again"
    assert (again.state.status, again.state.starts_at, again.state.resolved_at,
            again.state.acknowledged_by, again.state.occurrences) == (
        "firing", T0 + timedelta(seconds=60), None, None, 1)


def test_replays_stale_events_and_double_resolutions_change_nothing() -> None:
    state = raised()
    assert apply(state, FIRING) is None  # the same event again
    later = apply(state, event(10))
    assert later is not None
    assert apply(later.state, event(5)) is None  # older than the last change
    ended = apply(later.state, event(20, status="resolved"))
    assert ended is not None
    assert apply(ended.state, event(25, status="resolved")) is None


def test_a_resolution_before_any_firing_is_recorded_as_resolved() -> None:
    transition = apply(None, event(0, status="resolved"))
    assert transition is not None
    assert transition.change == "resolved"
    assert (transition.state.status, transition.state.occurrences) == ("resolved", 0)


def test_alertmanager_gets_stable_labels_and_an_end_a_few_resends_ahead() -> None:
    state = acknowledge(raised(), "bob", "on it", T0)
    now = T0 + timedelta(seconds=100)
    body = alertmanager_alert(state, now, OUT)
    assert body["labels"] == {"alertname": "breaker_open", "cluster": "local",
                              "severity": "critical", "dedup_key": "breaker.local.offline",
                              "service": "clusterwarden", "namespace": "prod"}
    assert body["startsAt"] == T0.isoformat().replace("+00:00", "Z")
    ends = now + timedelta(seconds=ENDS_AT_RESENDS * OUT.resend_s)
    assert body["endsAt"] == ends.isoformat().replace("+00:00", "Z")
    assert body["annotations"]["acknowledged_by"] == "bob"
    assert body["generatorURL"] == "https://warden.example/#alerts"
    # Without a namespace there is no namespace label.
    assert "namespace" not in labels(state, Outbound(resend_s=60.0))


def test_a_resolved_alert_ends_when_it_was_resolved() -> None:
    resolving = event(30, status="resolved")
    ended = apply(raised(), resolving)
    assert ended is not None
    body = alertmanager_alert(ended.state, T0 + timedelta(hours=1), OUT)
    assert body["endsAt"] == resolving.occurred_at.isoformat().replace("+00:00", "Z")
    assert body["annotations"]["resolution"] == resolving.message


def test_the_webhook_speaks_alertmanagers_format_with_the_change() -> None:
    body = webhook_body(raised(), "raised", T0, OUT)
    assert (body["version"], body["status"], body["change"]) == ("4", "firing", "raised")
    assert body["groupLabels"] == {"alertname": "breaker_open", "cluster": "local"}
    (alert,) = body["alerts"]
    assert alert["status"] == "firing"
    assert alert["labels"]["dedup_key"] == "breaker.local.offline"


def test_an_alert_from_before_the_status_field_is_a_firing_one() -> None:
    older = FIRING.model_dump(mode="json")
    del older["status"]
    assert Alert.model_validate_json(json.dumps(older)).status == "firing"
