"""The tuning policy (pure): decayed measures, the value clamp(ceil(capacity / measured)),
the drift threshold from the figure the active version stands for, and pinned templates."""

from __future__ import annotations

import pytest

from services.templater.tuning_spec import Tuning, tuning_problems
from services.tuner.policy import (
    TUNED_AT,
    Figure,
    Measure,
    baseline_of,
    combined,
    decayed,
    decide,
    evidence_of,
    target_value,
)

TUNING = Tuning(parameter="nodes_per_scale_out", capacity_per_task=200.0,
                drift_threshold=0.25, min_samples=10, min_value=1, max_value=16)


def measure(node_type: str, throughput: float, samples: int, gpus: float = 2.0) -> Measure:
    return Measure(cluster="c1", pool="p", node_type=node_type, throughput_per_node=throughput,
                   gpus_per_node=gpus, samples=samples, at=0.0)


def test_the_decayed_average_starts_at_the_first_value_and_moves_by_alpha() -> None:
    assert decayed(None, 10.0, 0.1) == 10.0
    assert decayed(10.0, 20.0, 0.1) == pytest.approx(11.0)
    assert decayed(10.0, 20.0, 1.0) == 20.0


def test_measures_combine_weighted_by_their_samples() -> None:
    figure = combined([measure("A100", 100.0, 30), measure("H100", 200.0, 10)])
    assert figure == Figure(throughput_per_node=125.0, samples=40)
    assert combined([]) == Figure(0.0, 0)
    assert measure("A100", 100.0, 1, gpus=4.0).throughput_per_gpu == 25.0


@pytest.mark.parametrize(("measured", "value"), [
    (100.0, 2), (200.0, 1), (150.0, 2), (400.0, 1), (10.0, 16), (66.7, 3), (66.6667, 3),
])
def test_the_value_is_the_ceiling_of_capacity_over_measured_clamped(measured: float,
                                                                     value: int) -> None:
    assert target_value(TUNING, measured) == value


def test_nodes_that_deliver_twice_as_much_halve_the_step() -> None:
    # Never tuned: version 1 with 2 nodes per scale-out stands for 200 / 2 = 100 per node.
    assert baseline_of(TUNING, 2, {}) == 100.0
    decision = decide(TUNING, 2, {}, Figure(200.0, 40), pinned=False)
    assert decision.acts
    assert (decision.value, decision.baseline, decision.drift) == (1, 100.0, 1.0)
    assert "nodes_per_scale_out 2 -> 1" in decision.reason
    evidence = evidence_of(decision, TUNING, [measure("A100", 200.0, 40)])
    assert evidence[TUNED_AT] == 200.0
    assert evidence["measures"][0]["throughput_per_gpu"] == 100.0
    assert evidence["measures"][0]["samples"] == 40


def test_a_drift_within_the_threshold_or_too_few_samples_changes_nothing() -> None:
    assert decide(TUNING, 2, {}, Figure(120.0, 40), False).verdict == "within_threshold"
    assert decide(TUNING, 2, {}, Figure(200.0, 9), False).verdict == "too_few_samples"
    assert decide(TUNING, 2, {}, Figure(0.0, 40), False).verdict in ("no_throughput",
                                                                     "too_few_samples")


def test_the_drift_is_measured_from_the_figure_the_version_was_tuned_at() -> None:
    tuned = {TUNED_AT: 200.0}
    # Tuned at 200: 230 is within 25 %, whatever the value alone would imply.
    assert decide(TUNING, 1, tuned, Figure(230.0, 40), False).verdict == "within_threshold"
    # Past the threshold but ceil(200 / 300) is still 1: no new version.
    assert decide(TUNING, 1, tuned, Figure(300.0, 40), False).verdict == "same_value"
    # Back down to 90 per node: three nodes per scale-out again.
    back = decide(TUNING, 1, tuned, Figure(90.0, 40), False)
    assert (back.verdict, back.value) == ("tune", 3)


def test_a_pinned_template_is_never_tuned_but_says_what_it_would_have_done() -> None:
    decision = decide(TUNING, 2, {}, Figure(200.0, 40), pinned=True)
    assert not decision.acts
    assert decision.verdict == "pinned"
    assert decision.reason.startswith("pinned; would have set")
    assert decision.value == 1


def test_a_tuning_section_must_name_an_integer_parameter_within_its_bounds() -> None:
    assert tuning_problems(TUNING, {"nodes_per_scale_out": 2}) == []
    assert "not one of the parameters" in tuning_problems(TUNING, {})[0]
    assert "integer" in tuning_problems(TUNING, {"nodes_per_scale_out": "2"})[0]
    assert "outside 1..16" in tuning_problems(TUNING, {"nodes_per_scale_out": 40})[0]
    with pytest.raises(ValueError, match="min_value is greater"):
        Tuning(parameter="x", capacity_per_task=1.0, min_value=5, max_value=2)
