"""Scheduler settings (env prefix SCHEDULER_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.scheduler.breaker import DEFAULT_DISRUPTIVE_KINDS, BreakerConfig
from services.shared.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    """Dispatch cadence, lease length and the circuit breaker's limits (RELIABILITY.md §3.6)."""

    model_config = SettingsConfigDict(env_prefix="SCHEDULER_", extra="ignore", frozen=True)

    dispatch_interval_s: float = Field(default=0.25, gt=0.0)
    lease_s: float = Field(
        default=15.0, gt=0.0, description="A claimed task not dispatched in time is requeued."
    )
    lock_margin_s: float = Field(default=600.0, ge=0.0)
    scan_limit: int = Field(
        default=50, ge=1, le=1000, description="Queued tasks looked at per claim."
    )
    breaker_window: int = Field(default=10, ge=1, le=1_000,
                                description="Outcomes the breaker remembers (count based).")
    breaker_min_calls: int = Field(default=3, ge=1, le=1_000)
    breaker_failure_rate_pct: float = Field(default=50.0, gt=0.0, le=100.0)
    breaker_consecutive_failures: int = Field(default=3, ge=1, le=1_000)
    breaker_wait_s: float = Field(
        default=60.0, ge=0.0, le=86_400.0,
        description="Open time before a non-disruptive breaker allows its half-open trial.",
    )
    breaker_max_half_open_s: float = Field(default=1_800.0, gt=0.0, le=86_400.0)
    breaker_disruptive_kinds: tuple[str, ...] = Field(
        default=DEFAULT_DISRUPTIVE_KINDS,
        description="Need kinds whose breaker only an admin reset closes.",
    )

    def breaker_config(self, kind: str) -> BreakerConfig:
        """The breaker limits for tasks of need kind `kind`."""
        return BreakerConfig(
            window=self.breaker_window, min_calls=self.breaker_min_calls,
            failure_rate_pct=self.breaker_failure_rate_pct,
            consecutive_failures=self.breaker_consecutive_failures,
            wait_s=self.breaker_wait_s, max_half_open_s=self.breaker_max_half_open_s,
            disruptive=kind in self.breaker_disruptive_kinds,
        )
