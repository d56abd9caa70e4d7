"""Utilisation forecasts: trend plus daily and weekly seasonality, fitted with statsmodels.

Pure: a utilisation series and a clock in, a `Forecast` out; no I/O. The input may have any
resolution (the analyzer keeps 10 s, 1 min and 1 h histories, see
`services.analyzer.store.PoolStore`); it is averaged into whole UTC hours first, because a
forecast a day and a week ahead needs no finer grain, and an hourly series keeps the seasonal
periods small (24 and 168).

The models, from the most to the least history they need:

* ``daily_weekly``: MSTL (robust STL, periods 24 h and 168 h) takes out both seasonal
  components; ETS(A,Ad,N) (additive errors, damped additive trend) forecasts what remains,
  with its intervals; each seasonal component's last cycle is repeated ahead.
* ``daily``: the same with the 24 h period only.
* ``trend``: ETS(A,Ad,N) on the series itself.
* ``naive``: too little history for any of them (or a constant one): the last value, with a
  random-walk interval.
* ``none``: not enough history to say anything; no points.

With ``seasonality="auto"`` every model the history is long enough for is fitted on the
history minus its last days (two by default) and scored on those days (mean absolute
error); the best one, the simplest on a tie, is refitted on everything. A seasonal model
is not assumed to help (on a series whose load moves in regimes rather than daily cycles it
does not), so one is used only once it can be tested: it needs two cycles to fit plus a
held-out day, i.e. 73 h for the daily model and 361 h (15 days) for the weekly one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import NormalDist
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

ModelKind = Literal["none", "naive", "trend", "daily", "daily_weekly"]
Seasonality = Literal["auto", "daily_weekly", "daily", "trend"]
FloatArray = NDArray[np.float64]

HOUR: Final = timedelta(hours=1)
DAY_H: Final = 24
WEEK_H: Final = 168
DEFAULT_HORIZONS: Final = (timedelta(days=1), timedelta(days=7))
# Below this many hourly points the ETS fit has more parameters than the data can pin down
# (level, trend, damping, two smoothing weights, the error variance).
MIN_TREND_HOURS: Final = 24
# The random-walk fallback needs two differences to estimate its spread.
MIN_NAIVE_HOURS: Final = 3
# Seasonal periods of each model; MSTL drops a period unless the series is longer than two
# cycles of it.
PERIODS: Final[Mapping[ModelKind, tuple[int, ...]]] = {
    "trend": (), "daily": (DAY_H,), "daily_weekly": (DAY_H, WEEK_H),
}
_ORDER: Final[tuple[ModelKind, ...]] = ("trend", "daily", "daily_weekly")
_COLUMNS: Final = ("mean", "lower_80", "upper_80", "lower_95", "upper_95")
_Z80: Final = NormalDist().inv_cdf(0.90)
_Z95: Final = NormalDist().inv_cdf(0.975)


class ForecastPoint(BaseModel):
    """The forecast for one hour starting at `at`: the mean and its 80 % and 95 % intervals."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    mean: float
    lower_80: float
    upper_80: float
    lower_95: float
    upper_95: float


class Forecast(BaseModel):
    """Hourly utilisation forecast, %, from the hour containing `generated_at` to the longest
    horizon, and how it was made."""

    model_config = ConfigDict(frozen=True)

    generated_at: datetime
    model: ModelKind
    model_detail: str = Field(description="The fitted model, e.g. its statsmodels classes.")
    seasonal_periods_h: tuple[int, ...] = ()
    horizons: tuple[timedelta, ...]
    resolution_s: int = 3_600
    history_from: datetime | None = Field(
        default=None, description="Start of the first whole hour of history used.")
    history_to: datetime | None = Field(
        default=None, description="Start of the last whole hour of history used.")
    history_hours: int = 0
    filled_hours: int = Field(
        default=0, description="Hours without samples inside the history, interpolated.")
    holdout_mae: dict[str, float] = Field(
        default_factory=dict,
        description="Per model tried, its mean absolute error (% points) on the held-out "
                    "last days of history; empty when there was no choice to make.")
    points: tuple[ForecastPoint, ...] = ()
    notes: tuple[str, ...] = ()

    def within(self, span: timedelta) -> tuple[ForecastPoint, ...]:
        """The points of the hours that start before `generated_at + span`."""
        end = self.generated_at + span
        return tuple(p for p in self.points if p.at < end)


@dataclass(frozen=True)
class _Hourly:
    """Whole UTC hours of history: the first hour's start, the values (gaps filled)."""

    start: datetime
    values: FloatArray
    filled: int


@dataclass(frozen=True)
class Fitted:
    """A fit's values ahead: the mean and its 80 % and 95 % intervals, one per step."""

    mean: FloatArray
    lower_80: FloatArray
    upper_80: FloatArray
    lower_95: FloatArray
    upper_95: FloatArray


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def hourly_series(series: Sequence[tuple[datetime, float]], now: datetime,
                  max_history: timedelta) -> _Hourly | None:
    """The mean of every whole UTC hour that ended by `now`, within `max_history`.

    The hour containing `now` is left out: it is still filling, and a partial mean is
    noisier than the forecast for it. Hours with no sample between the first and the last
    are filled by linear interpolation (a collector outage is not zero utilisation).
    """
    end = floor_hour(now)
    start = floor_hour(end - max_history)
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for at, value in series:
        if at.tzinfo is None:
            raise ValueError(f"naive timestamp {at.isoformat()}: every time must be aware (UTC)")
        at = at.astimezone(UTC)
        if not start <= at < end or not math.isfinite(value):
            continue
        bucket = int((at - start) // HOUR)
        sums[bucket] = sums.get(bucket, 0.0) + float(value)
        counts[bucket] = counts.get(bucket, 0) + 1
    if not sums:
        return None
    first, last = min(sums), max(sums)
    index = np.arange(first, last + 1, dtype=np.float64)
    known = np.array(sorted(sums), dtype=np.float64)
    means = np.array([sums[b] / counts[b] for b in sorted(sums)], dtype=np.float64)
    values = np.interp(index, known, means).astype(np.float64)
    return _Hourly(start + first * HOUR, values, int(index.size - known.size))


def _minimum_hours(kind: ModelKind) -> int:
    periods = PERIODS[kind]
    return 2 * max(periods) + 1 if periods else MIN_TREND_HOURS


def _fit(values: FloatArray, steps: int, periods: tuple[int, ...], damped: bool,
         intervals: bool = True) -> Fitted:
    """Decompose (if seasonal), fit ETS(A,Ad,N) to the rest and forecast `steps` hours."""
    # Imported here: they take a second to import, which callers that never forecast (the
    # API's other routes, the CLI) should not pay. Neither ships type information (no
    # pandas-stubs installed either); their objects stay Any inside this function.
    import pandas as pd  # type: ignore[import-untyped]
    from statsmodels.tsa.exponential_smoothing.ets import (  # type: ignore[import-untyped]
        ETSModel,
    )
    from statsmodels.tsa.seasonal import MSTL  # type: ignore[import-untyped]

    ahead = np.zeros(steps, dtype=np.float64)
    adjusted = values
    if periods:
        # Robust STL: an outage or a burst in the history (real traces have both) would
        # otherwise be copied into every future day or week. Locally constant seasonal
        # smoothing (R's stl default; statsmodels defaults to linear): the last cycle, the
        # one repeated ahead, sits at the series' edge, where a local line extrapolates noise
        # (on a test series its error fell from 0.58 to 0.33 points).
        decomposition: Any = MSTL(
            values, periods=periods, stl_kwargs={"robust": True, "seasonal_deg": 0}
        ).fit()
        seasonal = np.asarray(decomposition.seasonal, dtype=np.float64).reshape(values.size, -1)
        if seasonal.shape[1] != len(periods):
            raise ValueError(f"MSTL kept {seasonal.shape[1]} of the periods {periods}")
        adjusted = values - seasonal.sum(axis=1)
        for index, period in enumerate(periods):
            # The last cycle starts at phase (n - period) % period == n % period: repeating it
            # from its first value continues the phase.
            ahead += np.resize(seasonal[-period:, index], steps)
    # A pandas Series, not an array: statsmodels 0.15's ETS get_prediction reads `.index`
    # from its predicted mean, which only a pandas input has.
    model: Any = ETSModel(pd.Series(adjusted), error="add", trend="add",
                          damped_trend=damped)
    result: Any = model.fit(disp=False)
    n = values.size
    if not intervals:
        mean = np.asarray(result.forecast(steps), dtype=np.float64) + ahead
        return Fitted(mean, mean, mean, mean, mean)
    prediction: Any = result.get_prediction(start=n, end=n + steps - 1)
    f80: Any = prediction.summary_frame(alpha=0.20)
    f95: Any = prediction.summary_frame(alpha=0.05)

    def column(frame: Any, name: str) -> FloatArray:
        return np.asarray(frame[name], dtype=np.float64) + ahead

    return Fitted(column(f80, "mean"), column(f80, "pi_lower"), column(f80, "pi_upper"),
                   column(f95, "pi_lower"), column(f95, "pi_upper"))


def fit_ahead(values: FloatArray, steps: int, periods: tuple[int, ...] = (),
              damped: bool = True, notes: list[str] | None = None,
              min_points: int = MIN_TREND_HOURS) -> Fitted:
    """`steps` values ahead of a regular series of any resolution (the capacity plan's daily
    one): MSTL over `periods` (if any) plus ETS, as `forecast_utilisation` fits hours.

    A constant series, one shorter than `min_points` points, or a fit that is not finite
    gets the random-walk forecast; why goes to `notes`, with the fit's warnings.
    """
    notes = [] if notes is None else notes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if values.size < min_points or float(np.ptp(values)) == 0.0:
            notes.append(f"{values.size} points, constant or too few for a trend: "
                         "last value carried forward")
            return _naive(values, steps)
        fitted = _fit(values, steps, periods, damped)
    if not all(np.isfinite(getattr(fitted, name)).all() for name in _COLUMNS):
        notes.append("the fit gave non-finite values: last value carried forward")
        return _naive(values, steps)
    for message in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
        notes.append(message[:200])
    return fitted


def _naive(values: FloatArray, steps: int) -> Fitted:
    """The last value, widening as a random walk's: sigma of the hourly changes times sqrt(h)."""
    sigma = float(np.std(np.diff(values), ddof=1)) if values.size >= MIN_NAIVE_HOURS else 0.0
    spread = sigma * np.sqrt(np.arange(1, steps + 1, dtype=np.float64))
    mean = np.full(steps, float(values[-1]), dtype=np.float64)
    return Fitted(mean, mean - _Z80 * spread, mean + _Z80 * spread,
                   mean - _Z95 * spread, mean + _Z95 * spread)


def _holdout_mae(values: FloatArray, kind: ModelKind, damped: bool, origins: int) -> float:
    """Mean absolute error of `kind` forecasting each of the last `origins` days from the
    history before it."""
    errors = []
    for back in range(origins, 0, -1):
        cut = values.size - back * DAY_H
        fitted = _fit(values[:cut], DAY_H, PERIODS[kind], damped, intervals=False)
        errors.append(float(np.mean(np.abs(fitted.mean - values[cut:cut + DAY_H]))))
    return float(np.mean(errors))


def _describe(kind: ModelKind, damped: bool) -> str:
    import statsmodels  # type: ignore[import-untyped]

    ets = f"ETS(A,{'Ad' if damped else 'A'},N)"
    version = f"statsmodels {statsmodels.__version__}"
    if kind == "naive":
        return "last value carried forward, random-walk interval (see the notes for why)"
    if kind == "trend":
        return f"{ets} on the hourly series, {version}"
    periods = ",".join(f"{p}h" for p in PERIODS[kind])
    return f"MSTL(periods {periods}, robust) + {ets} on the seasonally adjusted series, {version}"


def _choose(values: FloatArray, seasonality: Seasonality, damped: bool, origins: int,
            notes: list[str]) -> tuple[ModelKind, dict[str, float]]:
    n = values.size
    if n < MIN_TREND_HOURS:
        notes.append(f"{n} h of history, {MIN_TREND_HOURS} needed for a trend model: "
                     "the last value is carried forward")
        return "naive", {}
    fits = [k for k in _ORDER if n >= _minimum_hours(k)]
    if seasonality != "auto":
        wanted = _ORDER.index(seasonality)
        chosen = fits[min(wanted, len(fits) - 1)]
        if chosen != seasonality:
            notes.append(f"{seasonality} asked for: needs {_minimum_hours(seasonality)} h of "
                         f"history, {n} h available; {chosen} used")
        return chosen, {}
    # A model competes only if it can also be fitted on the history minus the held-out days;
    # the held-out span shrinks (down to one day) so that the richest model fitted can be
    # tested, and a model that cannot be tested even on one day is not used: no seasonality
    # is assumed to help without evidence from this series.
    days = origins
    while len(fits) > 1:
        richest = fits[-1]
        days = min(origins, (n - _minimum_hours(richest)) // DAY_H)
        if days >= 1:
            break
        fits.pop()
    for kind in _ORDER[len(fits):]:
        notes.append(f"{kind} not used: needs {_minimum_hours(kind) + DAY_H} h of history (two "
                     f"cycles to fit, plus a held-out day to test it); {n} h available")
    if len(fits) < 2:
        return fits[0], {}
    scores = {k: _holdout_mae(values, k, damped, days) for k in fits}
    best = min(fits, key=lambda k: (scores[k], _ORDER.index(k)))
    notes.append(f"chosen on the last {days * DAY_H} h held out: " + ", ".join(
        f"{k} MAE {scores[k]:.2f}" for k in fits))
    return best, {k: round(v, 4) for k, v in scores.items()}


def _clip(values: FloatArray, bounds: tuple[float | None, float | None]) -> FloatArray:
    low, high = bounds
    return np.clip(values, -np.inf if low is None else low, np.inf if high is None else high)


def _check_arguments(now: datetime, horizons: Sequence[timedelta], selection_days: int) -> None:
    if now.tzinfo is None:
        raise ValueError("now must be aware (UTC)")
    if not horizons or min(horizons) <= timedelta(0):
        raise ValueError("horizons must be positive")
    if selection_days < 1:
        raise ValueError("selection_days must be at least 1")


def _fit_model(values: FloatArray, steps: int, seasonality: Seasonality, damped_trend: bool,
               selection_days: int, notes: list[str]
               ) -> tuple[ModelKind, dict[str, float], Fitted]:
    """The model chosen for `values` and its fit over `steps` hours, falling back to the
    naive forecast when the history is constant or the fit is not finite."""
    # Fit warnings (convergence, mostly) become notes instead of escaping to the caller.
    # catch_warnings swaps process-wide state: callers running forecasts in several threads
    # at once may see each other's warnings filtered (harmless: they are only notes here).
    kind: ModelKind
    scores: dict[str, float]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if float(np.ptp(values)) == 0.0:
            # An idle (or pinned) pool: every model would fit a line through a constant, and
            # ETS's likelihood is undefined with no variance at all.
            kind, scores = "naive", {}
            notes.append("the history is constant: carried forward, with no spread to "
                         "estimate an interval from")
        else:
            kind, scores = _choose(values, seasonality, damped_trend, selection_days, notes)
        fitted = (_naive(values, steps) if kind == "naive"
                  else _fit(values, steps, PERIODS[kind], damped_trend))
        if not all(np.isfinite(getattr(fitted, name)).all() for name in _COLUMNS):
            notes.append(f"the {kind} fit gave non-finite values: last value carried forward")
            kind, scores, fitted = "naive", {}, _naive(values, steps)
    for message in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
        notes.append(message[:200])
    return kind, scores, fitted


def _points(fitted: Fitted, bounds: tuple[float | None, float | None], last_at: datetime,
            first_point: datetime, end: datetime, steps: int) -> list[ForecastPoint]:
    """The fitted hours from the current one to the last horizon's end, clipped to `bounds`."""
    columns = [_clip(getattr(fitted, name), bounds) for name in _COLUMNS]
    points = []
    for i in range(steps):
        at = last_at + (i + 1) * HOUR
        if at < first_point or at >= end:
            continue
        mean, lo80, hi80, lo95, hi95 = (round(float(c[i]), 4) for c in columns)
        points.append(ForecastPoint(at=at, mean=mean, lower_80=lo80, upper_80=hi80,
                                    lower_95=lo95, upper_95=hi95))
    return points


def forecast_utilisation(
    series: Sequence[tuple[datetime, float]],
    now: datetime,
    horizons: Sequence[timedelta] = DEFAULT_HORIZONS,
    *,
    seasonality: Seasonality = "auto",
    max_history: timedelta = timedelta(days=56),
    bounds: tuple[float | None, float | None] = (0.0, None),
    damped_trend: bool = True,
    selection_days: int = 2,
) -> Forecast:
    """Forecast a utilisation series (%, any resolution, aware timestamps) hourly from the
    hour containing `now` to `now + max(horizons)`.

    `seasonality` "auto" chooses among the models the history allows (see the module doc),
    holding out its last `selection_days` days; naming a model uses it, or the richest one
    the history allows below it. `max_history` bounds the hours fitted (the cost grows with
    them, and old regimes stop mattering). `bounds` clips the mean and the intervals
    (effective utilisation counts queued demand, so it has no upper bound by default).
    `damped_trend` damps the trend so a week ahead does not extrapolate a day's slope
    seven-fold. Deterministic: no random draws (the ETS intervals are analytic).
    """
    _check_arguments(now, horizons, selection_days)
    now = now.astimezone(UTC)
    spans = tuple(sorted(horizons))
    history = hourly_series(series, now, max_history)
    notes: list[str] = []
    if history is None or history.values.size < MIN_NAIVE_HOURS:
        have = 0 if history is None else history.values.size
        return Forecast(
            generated_at=now, model="none", model_detail="no forecast", horizons=spans,
            history_hours=have,
            notes=(f"{have} whole hours of history before now, {MIN_NAIVE_HOURS} needed",),
        )
    values = history.values
    last_at = history.start + (values.size - 1) * HOUR
    first_point = floor_hour(now)
    end = now + spans[-1]
    # Forecast from the hour after the history to the hour containing the last horizon's end,
    # and report the hours from the current one on.
    steps = math.ceil((end - last_at) / HOUR) - 1
    steps = max(steps, 1)
    if last_at < first_point - HOUR:
        notes.append(f"history ends {(first_point - HOUR - last_at) // HOUR} h before the "
                     "last whole hour; the forecast spans the gap")
    if history.filled:
        notes.append(f"{history.filled} hours without samples filled by interpolation")
    kind, scores, fitted = _fit_model(values, steps, seasonality, damped_trend, selection_days,
                                      notes)
    points = _points(fitted, bounds, last_at, first_point, end, steps)
    return Forecast(
        generated_at=now, model=kind, model_detail=_describe(kind, damped_trend),
        seasonal_periods_h=PERIODS.get(kind, ()), horizons=spans,
        history_from=history.start, history_to=last_at, history_hours=int(values.size),
        filled_hours=history.filled, holdout_mae=scores, points=tuple(points),
        notes=tuple(notes),
    )
