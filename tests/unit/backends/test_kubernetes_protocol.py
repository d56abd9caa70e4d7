"""The node protocol's pure decisions: what offline and online write, and the one-owner rule
(a node someone else cordoned or tainted is never touched)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.kubernetes import OFFLINE_ANNOTATION, TAINT_KEY
from services.backends.base import Outcome, StepRef
from services.backends.kubernetes.protocol import (
    Claim,
    NodeView,
    claim_of,
    decide_drain_cordon,
    decide_offline,
    decide_online,
    taint_value,
)

STEP = StepRef(task_id="task-1", step="0:offline_node")
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute",
             "timeAdded": "2026-12-02T00:00:00Z"}


def node(*, unschedulable: bool = False, taints: tuple[dict[str, Any], ...] = (),
         claim: Claim | None = None, raw_claim: str | None = None) -> NodeView:
    annotations = {"kwok.x-k8s.io/node": "fake"}
    if claim is not None:
        annotations[OFFLINE_ANNOTATION] = claim.to_json()
    if raw_claim is not None:
        annotations[OFFLINE_ANNOTATION] = raw_claim
    return NodeView(name="gpu-1", resource_version="42", unschedulable=unschedulable,
                    taints=taints, annotations=annotations)


def offlined() -> NodeView:
    """A node ClusterWarden took offline (NoSchedule), with the node controller's taint too."""
    claim = Claim(task_id="task-1", step="0:offline_node", reason="xid 79", effect="NoSchedule")
    return node(unschedulable=True, claim=claim,
                taints=(NOT_READY, {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}))


def test_offline_cordons_taints_and_claims_keeping_other_taints() -> None:
    decision = decide_offline(node(taints=(NOT_READY,)), STEP, "xid 79", "NoSchedule")
    assert decision.outcome is Outcome.APPLIED
    assert decision.patch is not None
    assert decision.patch["metadata"]["resourceVersion"] == "42"
    assert decision.patch["spec"] == {
        "unschedulable": True,
        "taints": [NOT_READY, {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}]}
    claim = json.loads(decision.patch["metadata"]["annotations"][OFFLINE_ANNOTATION])
    assert claim == {"task_id": "task-1", "step": "0:offline_node", "reason": "xid 79",
                     "effect": "NoSchedule"}


def test_offline_of_a_node_already_offline_changes_nothing() -> None:
    decision = decide_offline(offlined(), STEP, "xid 79", "NoSchedule")
    assert decision.outcome is Outcome.ALREADY
    assert decision.patch is None


def test_offline_asking_noexecute_on_our_noschedule_node_replaces_our_taint() -> None:
    decision = decide_offline(offlined(), STEP, "xid 79", "NoExecute")
    assert decision.outcome is Outcome.APPLIED
    assert decision.patch is not None
    assert decision.patch["spec"]["taints"] == [
        NOT_READY, {"key": TAINT_KEY, "value": "xid-79", "effect": "NoExecute"}]


@pytest.mark.parametrize("view", [
    node(unschedulable=True),
    node(taints=({"key": TAINT_KEY, "value": "manual", "effect": "NoSchedule"},)),
    node(unschedulable=True, raw_claim="not json"),
], ids=["cordoned-by-a-person", "our-taint-key-set-by-a-person", "unreadable-claim"])
def test_a_node_someone_else_owns_is_refused_by_offline_and_online(view: NodeView) -> None:
    for decision in (decide_offline(view, STEP, "xid 79", "NoSchedule"), decide_online(view)):
        assert decision.outcome is Outcome.REFUSED
        assert decision.patch is None
        assert "someone else" in decision.detail


def test_online_removes_only_our_taint_cordon_and_claim() -> None:
    decision = decide_online(offlined())
    assert decision.outcome is Outcome.APPLIED
    assert decision.patch == {
        "metadata": {"resourceVersion": "42", "annotations": {OFFLINE_ANNOTATION: None}},
        "spec": {"unschedulable": None, "taints": [NOT_READY]}}


def test_online_of_a_node_that_is_not_offline_changes_nothing() -> None:
    decision = decide_online(node(taints=(NOT_READY,)))
    assert decision.outcome is Outcome.ALREADY
    assert decision.patch is None


def test_online_without_other_taints_clears_the_list() -> None:
    claim = Claim(task_id="t", step="s", reason="r", effect="NoSchedule")
    view = node(unschedulable=True, claim=claim,
                taints=({"key": TAINT_KEY, "value": "r", "effect": "NoSchedule"},))
    patch = decide_online(view).patch
    assert patch is not None
    assert patch["spec"]["taints"] is None


@pytest.mark.parametrize(("reason", "value"), [
    ("xid 79", "xid-79"),
    ("fatal XID: GPU fell off the bus!", "fatal-XID-GPU-fell-off-the-bus"),
    ("x" * 100, "x" * 63),
    ("!!!", "unhealthy"),
])
def test_taint_values_are_valid_label_values(reason: str, value: str) -> None:
    assert taint_value(reason) == value


def test_a_claim_reads_back_what_it_wrote() -> None:
    claim = Claim(task_id="t", step="s", reason="r", effect="NoExecute")
    assert claim_of(node(claim=claim)) == claim
    assert claim_of(node(raw_claim=json.dumps({"task_id": "t"}))) is None


def test_a_drain_cordons_and_claims_a_node_nobody_cordoned() -> None:
    decision = decide_drain_cordon(node(), STEP, "drain")
    assert decision.outcome is Outcome.APPLIED
    assert decision.patch is not None
    assert decision.patch["spec"]["unschedulable"] is True


def test_a_drain_keeps_the_claim_a_node_has_and_refuses_someone_elses_node() -> None:
    noexecute = Claim(task_id="task-0", step="0:offline_node", reason="xid 79",
                      effect="NoExecute")
    view = node(unschedulable=True, claim=noexecute,
                taints=({"key": TAINT_KEY, "value": "xid-79", "effect": "NoExecute"},))
    assert decide_drain_cordon(view, STEP, "drain").outcome is Outcome.ALREADY
    refused = decide_drain_cordon(node(unschedulable=True), STEP, "drain")
    assert refused.outcome is Outcome.REFUSED
    assert refused.patch is None
