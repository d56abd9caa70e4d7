"""The band and episode helpers the stateful needs share."""

from __future__ import annotations

from uuid import NAMESPACE_URL

import pytest

from schemas.ranges import BandArgs, Side
from services.analyzer.conditions import ConditionState
from services.analyzer.needs.hysteresis import advance, band_side, episode_id
from tests.unit.analyzer.timeline import T0, at

BAND = BandArgs()  # 20-80 %, exits 25/75 %


@pytest.mark.parametrize(
    ("prior", "value", "side"),
    [
        (None, 50.0, None), (None, 80.0, None), (None, 80.1, "high"), (None, 77.0, None),
        ("high", 77.0, "high"), ("high", 75.0, "high"), ("high", 74.9, None),
        (None, 20.0, None), (None, 19.9, "low"), (None, 23.0, None),
        ("low", 23.0, "low"), ("low", 25.0, "low"), ("low", 25.1, None),
        ("high", 10.0, "low"), ("low", 90.0, "high"),
    ],
)
def test_band_side(prior: Side | None, value: float, side: Side | None) -> None:
    assert band_side(prior, value, BAND) == side


def test_a_blocked_low_side_never_holds() -> None:
    assert band_side("low", 10.0, BAND, allow_low=False) is None
    assert band_side(None, 90.0, BAND, allow_low=False) == "high"


@pytest.mark.parametrize(
    ("prior", "in_force", "seconds", "state", "raise_now"),
    [
        (None, None, 0, None, False),
        (None, "high", 0, ConditionState(since=at(0), detail="high"), False),
        (ConditionState(since=at(0), detail="high"), "high", 59,
         ConditionState(since=at(0), detail="high"), False),
        (ConditionState(since=at(0), detail="high"), "high", 60,
         ConditionState(since=at(0), raised=True, detail="high"), True),
        (ConditionState(since=at(0), raised=True, detail="high"), "high", 600,
         ConditionState(since=at(0), raised=True, detail="high"), False),
        (ConditionState(since=at(0), raised=True, detail="high"), "low", 600,
         ConditionState(since=at(600), detail="low"), False),
        (ConditionState(since=at(0), raised=True, detail="high"), None, 600, None, False),
    ],
)
def test_advance(prior: ConditionState | None, in_force: str | None, seconds: float,
                 state: ConditionState | None, raise_now: bool) -> None:
    assert advance(prior, in_force, at(seconds), 60.0) == (state, raise_now)


def test_zero_hold_raises_on_entry() -> None:
    assert advance(None, "low", T0, 0.0) == (
        ConditionState(since=T0, raised=True, detail="low"), True)


def test_episode_ids_differ_by_every_part() -> None:
    ids = {
        episode_id(NAMESPACE_URL, "c", "p", "t", "scale_out", T0),
        episode_id(NAMESPACE_URL, "c2", "p", "t", "scale_out", T0),
        episode_id(NAMESPACE_URL, "c", "p2", "t", "scale_out", T0),
        episode_id(NAMESPACE_URL, "c", "p", "t2", "scale_out", T0),
        episode_id(NAMESPACE_URL, "c", "p", "t", "scale_in", T0),
        episode_id(NAMESPACE_URL, "c", "p", "t", "scale_out", at(1)),
    }
    assert len(ids) == 6
    assert episode_id(NAMESPACE_URL, "c", "p", "t", "scale_out", T0) in ids
