"""Utilisation forecasts and the capacity report drawn from them (pure; nothing acts).

`forecast_utilisation(series, now)` turns a pool's utilisation history into an hourly
forecast for the next day and week; `capacity_report(forecast, band, nodes_now)` reads it
against the scale need's range: when the range will be left, how many nodes the peak needs,
and a shadow scale-out proposal. Never a scale-in. `capacity_plan(hourly, daily, now, band,
shape)` (planning.py) looks weeks to months ahead from the daily and hourly history, for
procurement: when the range is left, how many nodes of which type to add by when.
"""

from services.forecast.capacity import (
    CapacityReport,
    CapacityWindow,
    Peak,
    RangeExit,
    ShadowProposal,
    capacity_report,
    nodes_needed,
)
from services.forecast.model import (
    DEFAULT_HORIZONS,
    Forecast,
    ForecastPoint,
    ModelKind,
    Seasonality,
    forecast_utilisation,
)
from services.forecast.planning import (
    NodeType,
    PlanSettings,
    PoolShape,
    capacity_plan,
)

__all__ = [
    "DEFAULT_HORIZONS",
    "CapacityReport",
    "CapacityWindow",
    "Forecast",
    "ForecastPoint",
    "ModelKind",
    "NodeType",
    "Peak",
    "PlanSettings",
    "PoolShape",
    "RangeExit",
    "Seasonality",
    "ShadowProposal",
    "capacity_plan",
    "capacity_report",
    "forecast_utilisation",
    "nodes_needed",
]
