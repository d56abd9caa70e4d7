"""Scheduler settings (env prefix SCHEDULER_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.shared.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    """Dispatch cadence and lease length."""

    model_config = SettingsConfigDict(env_prefix="SCHEDULER_", extra="ignore", frozen=True)

    dispatch_interval_s: float = Field(default=0.25, gt=0.0)
    lease_s: float = Field(
        default=15.0, gt=0.0, description="A claimed task not dispatched in time is requeued."
    )
    lock_margin_s: float = Field(default=600.0, ge=0.0)
    scan_limit: int = Field(
        default=50, ge=1, le=1000, description="Queued tasks looked at per claim."
    )
