"""forecast_utilisation: recovers a known trend and daily cycle, degrades cleanly with short
history, resamples any resolution, and is deterministic."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from services.forecast import Forecast, forecast_utilisation
from services.forecast.model import hourly_series
from tests.unit.forecast.synthetic import HOUR, NOW, hourly, truth

DAY = timedelta(days=1)
WEEK = timedelta(days=7)


def errors(forecast: Forecast, span: timedelta, **shape: float) -> np.ndarray:
    return np.array([p.mean - truth(p.at, **shape) for p in forecast.within(span)])


@pytest.fixture(scope="module")
def three_weeks() -> Forecast:
    return forecast_utilisation(hourly(21), NOW)


def test_recovers_trend_and_daily_cycle(three_weeks: Forecast) -> None:
    f = three_weeks
    assert f.model in ("daily", "daily_weekly")
    assert f.seasonal_periods_h[0] == 24
    assert set(f.holdout_mae) == {"trend", "daily", "daily_weekly"}
    # Noise sd 1: the next day's mean within about a point of the noise-free truth.
    day = errors(f, DAY)
    assert np.mean(np.abs(day)) < 1.0
    # The daily cycle: peak near 06:00, trough near 18:00, swing about 2 x 10.
    points = f.within(DAY)
    means = [p.mean for p in points]
    assert abs(points[int(np.argmax(means))].at.hour - 6) <= 1
    assert abs(points[int(np.argmin(means))].at.hour - 18) <= 1
    assert 17.0 < max(means) - min(means) < 23.0
    # The intervals hold the truth and nest.
    assert all(p.lower_95 <= p.lower_80 <= p.mean <= p.upper_80 <= p.upper_95 for p in f.points)
    assert np.mean([p.lower_95 <= truth(p.at) <= p.upper_95 for p in points]) >= 0.95


def test_without_noise_the_components_come_back_almost_exactly() -> None:
    f = forecast_utilisation(hourly(21, noise=0.0), NOW, seasonality="daily")
    assert float(np.max(np.abs(errors(f, DAY)))) < 0.2


def test_the_week_ahead_keeps_the_cycle_and_damps_the_trend(three_weeks: Forecast) -> None:
    week = errors(three_weeks, WEEK)
    assert len(week) == 168
    # Damped: the 7th day's trend is below the straight extrapolation, but not by more
    # than the 3.4 points the trend rises in that week, and never above it.
    last_day = week[-24:]
    assert -3.4 - 1.0 < float(np.mean(last_day)) < 0.5
    assert np.std(last_day) < 1.5  # the cycle still lines up a week out


def test_an_undamped_trend_is_recovered_a_week_out() -> None:
    f = forecast_utilisation(hourly(21), NOW, damped_trend=False, seasonality="daily")
    assert f.model == "daily"
    assert "ETS(A,A,N)" in f.model_detail
    assert abs(float(np.mean(errors(f, WEEK)[-24:]))) < 1.5


def test_a_flat_series_without_a_cycle_is_not_given_one() -> None:
    f = forecast_utilisation(hourly(21, slope_per_h=0.0, amplitude=0.0), NOW)
    means = [p.mean for p in f.within(WEEK)]
    assert max(means) - min(means) < 3.0
    assert abs(float(np.mean(means)) - 50.0) < 1.0


def test_points_cover_each_horizon_from_the_current_hour() -> None:
    now = NOW + timedelta(minutes=30)
    f = forecast_utilisation(hourly(21, end=NOW), now, seasonality="daily")
    assert f.generated_at == now
    assert f.horizons == (DAY, WEEK)
    assert f.points[0].at == NOW  # the hour containing now
    assert len(f.within(DAY)) == 25
    assert len(f.points) == 169
    assert all(b.at - a.at == HOUR for a, b in zip(f.points, f.points[1:], strict=False))
    assert f.points[-1].at < now + WEEK <= f.points[-1].at + HOUR


def test_any_resolution_is_averaged_into_hours() -> None:
    # Values on a 1/1024 grid: twelve copies of one add up, and divide by 12, exactly, so
    # the fine series averages back to the very same hours and both forecasts fit the same
    # input (bit for bit, on any BLAS kernel or CPU). Arbitrary values would average back an
    # ulp or two off, and the ETS optimiser can turn an ulp into a few hundredths of a point
    # (it stops at a slightly different optimum), so their forecasts agree only loosely.
    hours = [(at, round(v * 1024) / 1024) for at, v in hourly(21)]
    # The same hourly values as twelve 5-minute samples each, plus the current (partial) hour
    # and the future, which must be ignored.
    fine = [(at + i * timedelta(minutes=5), v) for at, v in hours for i in range(12)]
    fine += [(NOW + timedelta(minutes=5), 0.0), (NOW + DAY, 100.0)]
    now = NOW + timedelta(minutes=10)
    resampled = hourly_series(fine, now, 4 * WEEK)
    assert resampled is not None
    assert (resampled.start, resampled.filled) == (hours[0][0], 0)
    assert resampled.values.tolist() == [v for _, v in hours]
    a = forecast_utilisation(hours, now, seasonality="daily")
    b = forecast_utilisation(fine, now, seasonality="daily")
    assert b.history_hours == a.history_hours == 21 * 24
    assert b == a


def test_gaps_are_interpolated_and_a_stale_history_is_spanned() -> None:
    series = [s for s in hourly(10) if not NOW - 3 * DAY <= s[0] < NOW - 3 * DAY + 5 * HOUR]
    f = forecast_utilisation(series, NOW + 6 * HOUR)
    assert f.filled_hours == 5
    assert any("5 hours without samples" in n for n in f.notes)
    assert any("history ends 6 h before" in n for n in f.notes)
    assert f.points[0].at == NOW + 6 * HOUR


@pytest.mark.parametrize(
    ("hours", "model", "noted"),
    [
        (0, "none", "0 whole hours"),
        (2, "none", "3 needed"),
        (10, "naive", "carried forward"),
        (30, "trend", "daily not used"),
        (60, "trend", "daily not used: needs 73 h"),
        (100, "daily", "daily_weekly not used: needs 361 h"),
    ],
)
def test_short_history_degrades_cleanly(hours: int, model: str, noted: str) -> None:
    # A cycle too strong to miss: from 100 h on, the daily model wins its held-out day.
    f = forecast_utilisation(hourly(hours / 24, amplitude=15.0), NOW)
    assert f.model == model
    assert f.history_hours == hours
    assert any(noted in n for n in f.notes), f.notes
    if model == "none":
        assert f.points == ()
        return
    assert len(f.points) == 168
    if model == "naive":
        assert len({p.mean for p in f.points}) == 1
        widths = [p.upper_80 - p.lower_80 for p in f.points]
        assert widths == sorted(widths)
        assert widths[0] > 0


@pytest.mark.parametrize("value", [0.0, 50.0])
def test_a_constant_history_is_carried_forward_quietly(value: float) -> None:
    series = [(NOW - (i + 1) * HOUR, value) for i in range(5 * 24)]
    f = forecast_utilisation(series, NOW)
    assert f.model == "naive"
    assert {(p.mean, p.lower_95, p.upper_95) for p in f.points} == {(value, value, value)}
    assert f.notes == ("the history is constant: carried forward, with no spread to estimate "
                       "an interval from",)


def test_a_named_model_degrades_to_what_the_history_allows() -> None:
    f = forecast_utilisation(hourly(5), NOW, seasonality="daily_weekly")
    assert f.model == "daily"
    assert f.holdout_mae == {}
    assert any("daily_weekly asked for" in n for n in f.notes)


def test_bounds_clip_mean_and_intervals() -> None:
    falling = hourly(4, level=5.0, slope_per_h=-0.2, amplitude=0.0, noise=0.5)
    f = forecast_utilisation(falling, NOW)
    assert min(p.lower_95 for p in f.points) == 0.0
    capped = forecast_utilisation(falling, NOW, bounds=(0.0, 3.0))
    assert max(p.upper_95 for p in capped.points) <= 3.0


def test_max_history_bounds_the_hours_fitted() -> None:
    f = forecast_utilisation(hourly(30), NOW, max_history=timedelta(days=10))
    assert f.history_hours == 240
    assert f.history_from == NOW - 10 * DAY


def test_deterministic() -> None:
    # Five days: the auto choice (trend against daily, on held-out days) runs too.
    series = hourly(5, seed=5)
    a = forecast_utilisation(series, NOW)
    b = forecast_utilisation(list(reversed(series)), NOW)
    assert a.holdout_mae
    assert a.model_dump() == b.model_dump()


def test_json_ready() -> None:
    f = forecast_utilisation(hourly(4), NOW)
    again = Forecast.model_validate_json(f.model_dump_json())
    assert again == f


@pytest.mark.parametrize(
    "bad",
    [
        {"now": datetime(2026, 3, 2)},  # noqa: DTZ001 - the naive time is the point
        {"horizons": ()},
        {"horizons": (timedelta(0),)},
        {"selection_days": 0},
    ],
)
def test_bad_arguments(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"series": hourly(2), "now": NOW} | bad
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        forecast_utilisation(**args)  # type: ignore[arg-type]


def test_naive_sample_times_are_refused() -> None:
    with pytest.raises(ValueError, match="naive timestamp"):
        forecast_utilisation([(datetime(2026, 3, 1), 50.0)], NOW)  # noqa: DTZ001
