"""The router's pure parts: candidates from the registry, their bound, and cause mapping."""

from __future__ import annotations

import random
from typing import get_args

import pytest

from schemas.events.v1 import CommandResult, InferenceCause
from services.router.decisions import POLICY_CAUSE, attributed_to, cause_of
from services.router.policy.attribution import CAUSES
from services.router.policy.selector import Candidate
from services.router.registry import NodeModels, bounded, candidates, split_model
from tests.contracts.examples import example
from tests.unit.router.helpers import served

NOW = 1_000.0


def entry(node: str, *models: tuple[str, str, str], mode: str = "active", at: float = NOW,
          state: str = "ready") -> NodeModels:
    return NodeModels(node=node, seq=1, at=at, interval_s=1.0, mode=mode,  # type: ignore[arg-type]
                      models=[served(m, v, f, state=state) for m, v, f in models])


def test_candidates_carry_versions_predecessors_groups_and_readiness() -> None:
    entries = [
        entry("n1", ("digits-mlp", "1", "mlp"), ("digits-knn", "1", "knn")),
        entry("n2", ("digits-mlp", "10", "mlp"), ("digits-mlp", "2", "mlp")),
        entry("n3", ("digits-mlp", "1", "mlp"), mode="draining"),
        entry("n4", ("digits-mlp", "1", "mlp"), at=NOW - 30.0),
        entry("n5", ("digits-mlp", "1", "mlp"), state="loading"),
    ]
    found = {c.arm: c for c in candidates(entries, "digits", NOW, {"digits": ["knn", "mlp"]},
                                          10.0)}
    assert found["arm:digits-mlp:2@n2"].predecessor == "digits-mlp:1"
    # Versions compare as numbers: 10 follows 2.
    assert found["arm:digits-mlp:10@n2"].predecessor == "digits-mlp:2"
    assert found["arm:digits-mlp:1@n1"].predecessor is None
    assert (found["arm:digits-knn:1@n1"].group, found["arm:digits-mlp:1@n1"].group) == (0, 1)
    assert {a for a, c in found.items() if not c.ready} == {
        "arm:digits-mlp:1@n3", "arm:digits-mlp:1@n4", "arm:digits-mlp:1@n5"}
    assert found["arm:digits-mlp:1@n1"].max_ongoing == 4
    assert candidates(entries, "speech", NOW, {}, 10.0) == []
    assert split_model("digits-mlp:10") == ("digits-mlp", "10")


def test_a_large_fleet_is_bounded_ready_and_primary_first() -> None:
    found = [Candidate(model="m:1", node=f"n{i:02d}", family="f", group=i % 2,
                       ready=i % 5 != 0) for i in range(40)]
    chosen = bounded(found, 12, random.Random(1))
    assert len(chosen) == 12
    assert all(c.ready and c.group == 0 for c in chosen)
    assert bounded(found[:5], 12, random.Random(1)) == found[:5]
    few_ready = [Candidate(model="m:1", node=f"n{i}", family="f", ready=i < 2)
                 for i in range(10)]
    kept = bounded(few_ready, 4, random.Random(1))
    assert sum(c.ready for c in kept) == 2
    assert len(kept) == 4


def test_every_cause_maps_to_the_selectors_words() -> None:
    assert set(POLICY_CAUSE) == set(get_args(InferenceCause))
    assert set(POLICY_CAUSE.values()) <= set(CAUSES)


@pytest.mark.parametrize(
    ("cause", "blamed"),
    [("model_fault", "model"), ("node_fault", "node"), ("timeout", "both"),
     ("unknown", "both"), ("bad_input", "neither"), ("capacity", "neither"),
     ("unavailable", "neither"), ("deadline_too_short", "neither"), (None, None)],
)
def test_attribution_as_the_outcome_states_it(cause: InferenceCause | None,
                                              blamed: str | None) -> None:
    assert attributed_to(cause) == blamed


def test_an_answer_without_an_inference_output_is_unknown_or_unavailable() -> None:
    base = example("command_result", CommandResult)
    failed = base.model_copy(update={"outcome": "failed", "reason": "injected_failure"})
    rejected = base.model_copy(update={"outcome": "rejected", "reason": "expired"})
    assert cause_of(failed) == "unknown"
    assert cause_of(rejected) == "unavailable"
