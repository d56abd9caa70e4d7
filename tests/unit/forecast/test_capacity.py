"""capacity_report: range exits, nodes for the peak, the shadow scale-out, never a scale-in."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.analyzer.needs.scale import Args as ScaleArgs
from services.forecast import (
    CapacityReport,
    Forecast,
    ForecastPoint,
    capacity_report,
    forecast_utilisation,
    nodes_needed,
)
from tests.unit.forecast.synthetic import HOUR, NOW, hourly

BAND = ScaleArgs()  # 20-80 %, left at 25/75 %
DAY = timedelta(days=1)
WEEK = timedelta(days=7)


def made(means: Sequence[float], spread: float = 5.0, model: str = "trend") -> Forecast:
    """A forecast with the given hourly means from NOW, intervals +/- spread (x2 for 95 %)."""
    points = tuple(
        ForecastPoint(at=NOW + i * HOUR, mean=m, lower_80=m - spread, upper_80=m + spread,
                      lower_95=m - 2 * spread, upper_95=m + 2 * spread)
        for i, m in enumerate(means)
    )
    return Forecast(generated_at=NOW, model=model,  # type: ignore[arg-type]
                    model_detail="test", horizons=(DAY, WEEK), points=points)


@pytest.mark.parametrize(
    ("peak", "nodes", "capacity", "per_node", "expected"),
    [
        (90.0, 10, 10.0, 1.0, 12),   # 9 of load at 75 % needs 12
        (75.0, 10, 10.0, 1.0, 10),   # exactly at the exit: no float-dust extra node
        (76.0, 10, 10.0, 1.0, 11),
        (30.0, 10, 10.0, 1.0, 4),    # the count may be below today's (never proposed)
        (90.0, 10, 20.0, 2.0, 12),   # 2-GPU nodes: 18 GPUs of load / 0.75 = 24 GPUs
        (90.0, 10, 16.0, 8.0, 11),   # 8-GPU standby: 14.4 / 0.75 = 19.2, one more covers it
        (0.0, 10, 10.0, 1.0, 0),
        (90.0, 0, 0.0, 1.0, None),   # no capacity to read a percentage against
    ],
)
def test_nodes_needed(peak: float, nodes: int, capacity: float, per_node: float,
                      expected: int | None) -> None:
    assert nodes_needed(peak, nodes, capacity, per_node, BAND.high_exit) == expected


def test_a_rise_through_the_range_gives_a_shadow_scale_out() -> None:
    # 70 % now, climbing 3 points an hour to a plateau at 94 %.
    means = [min(70.0 + 3 * i, 94.0) for i in range(169)]
    report = capacity_report(made(means), BAND, nodes_now=20)
    day, week = report.windows
    assert (day.horizon, week.horizon) == (DAY, WEEK)
    assert (day.hours, week.hours) == (24, 168)
    assert day.first_above_mean is not None
    assert day.first_above_mean.at == NOW + 4 * HOUR  # 82 % > 80 %
    assert day.first_above_mean.value == 82.0
    assert day.first_above_upper_80 is not None
    assert day.first_above_upper_80.at == NOW + 2 * HOUR  # 76 + 5 > 80
    assert day.first_below_mean is None
    assert day.peak_mean is not None
    assert day.peak_mean.value == 94.0
    assert day.peak_mean.at == NOW + 8 * HOUR  # the first hour of the plateau
    assert day.nodes_needed_mean == 26  # 18.8 nodes of load / 0.75 = 25.07
    assert day.nodes_needed_upper_80 == 27  # 99 %: 19.8 / 0.75 = 26.4
    p = report.proposal
    assert p is not None
    assert (p.action, p.shadow, p.nodes, p.nodes_now, p.nodes_after) == (
        "scale_out", True, 6, 20, 26)
    assert p.before == NOW + 4 * HOUR - timedelta(minutes=15)
    assert p.leaves_range_at == NOW + 4 * HOUR
    assert p.peak_after_pct == pytest.approx(94.0 * 20 / 26, abs=1e-3)
    assert p.peak_after_pct <= BAND.high_exit
    assert "scale out by 6 before" in p.reason
    assert "not acted on" in p.reason
    assert report.proposal_reason == p.reason
    assert report.scale_in is None


def test_the_proposal_basis_and_lead_time_are_choices() -> None:
    means = [76.0] * 169  # the mean stays inside, its 80 % upper bound (81) does not
    by_mean = capacity_report(made(means), BAND, nodes_now=20)
    assert by_mean.proposal is None
    assert "stays at or below 80%" in by_mean.proposal_reason
    assert by_mean.windows[0].first_above_upper_80 is not None
    by_upper = capacity_report(made(means), BAND, nodes_now=20, basis="upper_80",
                               lead_time=timedelta(hours=1))
    assert by_upper.proposal is not None
    assert by_upper.proposal.nodes == 2  # 81 % of 20 = 16.2 nodes / 0.75 = 21.6
    assert by_upper.proposal.before == NOW  # never before now


def test_only_the_proposal_horizon_counts_for_the_proposal() -> None:
    means = [60.0] * 72 + [90.0] * 97  # leaves the range on day 4
    report = capacity_report(made(means), BAND, nodes_now=10)
    assert report.windows[0].first_above_mean is None
    assert report.windows[1].first_above_mean is not None
    assert report.windows[1].nodes_needed_mean == 12
    assert report.proposal is None
    week = capacity_report(made(means), BAND, nodes_now=10, proposal_horizon=WEEK)
    assert week.proposal is not None
    assert week.proposal.nodes == 2


def test_already_above_the_range_defers_to_the_measured_need() -> None:
    report = capacity_report(made([85.0] * 169), BAND, nodes_now=10)
    assert report.proposal is not None
    assert report.proposal.before == NOW
    assert "measured scale need is the one that acts" in report.proposal.reason


def test_a_fall_below_the_range_never_proposes_a_scale_in() -> None:
    means = [max(40.0 - 2 * i, 5.0) for i in range(169)]
    report = capacity_report(made(means), BAND, nodes_now=10)
    day = report.windows[0]
    assert day.first_below_mean is not None
    assert day.first_below_mean.value < 20.0
    assert day.nodes_needed_mean == 6  # fewer would do: reported, never proposed
    assert report.proposal is None
    assert report.scale_in is None
    assert "falls below 20%" in report.scale_in_reason
    assert "no scale-in on a forecast" in report.scale_in_reason


def test_no_forecast_no_proposal() -> None:
    empty = Forecast(generated_at=NOW, model="none", model_detail="no forecast",
                     horizons=(DAY, WEEK))
    report = capacity_report(empty, BAND, nodes_now=10)
    assert report.proposal is None
    assert report.proposal_reason == "no forecast to propose from"
    assert all(w.hours == 0 and w.peak_mean is None for w in report.windows)


def test_an_empty_pool_has_no_node_count() -> None:
    report = capacity_report(made([90.0] * 169), BAND, nodes_now=0)
    assert report.windows[0].nodes_needed_mean is None
    assert report.proposal is None
    assert "no capacity now" in report.proposal_reason


@pytest.mark.parametrize(
    "bad", [{"nodes_now": -1}, {"per_node_capacity": 0.0}, {"capacity_now": -1.0},
            {"lead_time": timedelta(minutes=-1)}])
def test_bad_arguments(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"forecast": made([50.0]), "band": BAND, "nodes_now": 1} | bad
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        capacity_report(**args)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    means=st.lists(st.floats(0.0, 150.0), min_size=1, max_size=48),
    spread=st.floats(0.0, 30.0),
    nodes=st.integers(0, 500),
    per_node=st.sampled_from([1.0, 2.0, 8.0]),
    basis=st.sampled_from(["mean", "upper_80", "upper_95"]),
)
def test_never_a_scale_in(means: list[float], spread: float, nodes: int, per_node: float,
                          basis: str) -> None:
    report = capacity_report(made(means, spread), BAND, nodes, per_node,
                             basis=basis)  # type: ignore[arg-type]
    assert report.scale_in is None
    p = report.proposal
    if p is not None:
        assert p.action == "scale_out"
        assert p.shadow is True
        assert p.nodes >= 1
        assert p.nodes_after == p.nodes_now + p.nodes > nodes
        assert p.peak_after_pct <= BAND.high_exit + 1e-9
        assert p.before >= NOW


def test_from_a_real_forecast_and_json_ready() -> None:
    # A pool at ~70 % rising 0.5 points an hour: it leaves 80 % within the day.
    series = hourly(4, level=70.0, slope_per_h=0.5, amplitude=0.0, noise=0.3)
    forecast = forecast_utilisation(series, NOW, damped_trend=False)
    report = capacity_report(forecast, BAND, nodes_now=40, per_node_capacity=8.0)
    assert report.model == forecast.model
    assert report.proposal is not None
    assert report.proposal.leaves_range_at <= NOW + 21 * HOUR
    assert CapacityReport.model_validate_json(report.model_dump_json()) == report
