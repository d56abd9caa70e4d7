"""A template's `tuning:` section: which parameter the tuner may change, and how.

A template opts in to self-tuning by naming one integer parameter and the capacity one task
must deliver; the tuner (services/tuner/) then keeps that parameter in step with the capacity
nodes are measured to deliver, by saving new versions of the template.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# What the tuner measures: the delivered job throughput of one node (the sum over its running
# jobs, `JobInfo.throughput`), per node type, averaged over the pool.
TuningMetric = Literal["throughput_per_node"]


class Tuning(BaseModel):
    """value = clamp(ceil(capacity_per_task / measured metric), min_value, max_value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameter: str = Field(description="The integer parameter the tuner sets.")
    capacity_per_task: float = Field(gt=0.0, le=1e12, description="Throughput units one task "
                                     "(e.g. one scale-out) must add.")
    metric: TuningMetric = "throughput_per_node"
    drift_threshold: float = Field(default=0.25, gt=0.0, le=10.0, description="Relative change "
                                   "of the measured figure, from the one the active version "
                                   "was tuned at, that makes the tuner act.")
    min_samples: int = Field(default=20, ge=1, le=1_000_000)
    min_value: int = Field(default=1, ge=0, le=1_000)
    max_value: int = Field(default=16, ge=1, le=1_000)

    @model_validator(mode="after")
    def _bounds(self) -> Tuning:
        if self.min_value > self.max_value:
            raise ValueError("min_value is greater than max_value")
        return self


def tuning_problems(tuning: Tuning | None, parameters: dict[str, object]) -> list[str]:
    """What is wrong with a tuning section given the template's parameters (`field: why`)."""
    if tuning is None:
        return []
    value = parameters.get(tuning.parameter)
    if value is None:
        return [f"tuning.parameter: {tuning.parameter!r} is not one of the parameters"]
    if isinstance(value, bool) or not isinstance(value, int):
        return [f"tuning.parameter: {tuning.parameter!r} must be an integer parameter"]
    if not tuning.min_value <= value <= tuning.max_value:
        return [f"tuning.parameter: {tuning.parameter} = {value} is outside "
                f"{tuning.min_value}..{tuning.max_value}"]
    return []
