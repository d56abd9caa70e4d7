"""Utilisation ranges: the one home of the band type, of the band with its hold that the
analyzer and the capacity forecast are configured with, and of the default pool and node ranges.

The analyzer raises needs when a value leaves a range; the executor's guards and plans check
the same range on fresh state before acting. So the ranges travel with the work: a need
carries the `Ranges` it was raised under, the templater copies them onto the task, and the
executor reads them from the task. A message without them (from an older producer) means the
documented defaults below: both ranges 20-80 %, left at 25/75 %.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from schemas.envelope import Strict

Threshold = Annotated[float, Field(ge=0.0, le=1e6)]

Side = Literal["high", "low"]
"""Which side of a band a value is out on."""


class Band(Strict):
    """A utilisation range, %: a value enters above/below `*_enter` and leaves past `*_exit`."""

    low_enter: Threshold = 20.0
    low_exit: Threshold = 25.0
    high_enter: Threshold = 80.0
    high_exit: Threshold = 75.0

    @model_validator(mode="after")
    def _thresholds_nest(self) -> Band:
        # Exits inside entries, and the two sides apart: otherwise a value could be in both
        # conditions at once, or leave one the moment it entered.
        if not self.low_enter <= self.low_exit < self.high_exit <= self.high_enter:
            raise ValueError(
                "need low_enter <= low_exit < high_exit <= high_enter, got "
                f"{self.low_enter}, {self.low_exit}, {self.high_exit}, {self.high_enter}"
            )
        return self

    def band(self) -> Band:
        """Just the thresholds, as a plain `Band` (a subclass's other fields left out)."""
        return Band(low_enter=self.low_enter, low_exit=self.low_exit,
                    high_enter=self.high_enter, high_exit=self.high_exit)


class BandArgs(Band):
    """A range the analyzer checks (the contract's `Band`) and how long a value must be out
    of it before it is a need. Read from the environment, so not strict like the wire; only
    its `band()` travels with a need."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    hold_s: float = Field(
        default=60.0, ge=0.0, le=86_400.0,
        description="The condition must hold this long before it is a need (a spike is not).",
    )


class Ranges(Strict):
    """The ranges a need was raised under: the pool's (scale) and the nodes' (load balance)."""

    pool: Band = Field(default_factory=Band, description="A pool's effective utilisation.")
    node: Band = Field(default_factory=Band, description="A node's utilisation in its pool.")


DEFAULT_RANGES = Ranges()
