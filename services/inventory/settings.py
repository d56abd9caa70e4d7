"""Inventory settings (env prefix INVENTORY_)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings


class InventorySettings(ServiceSettings):
    """How often each cluster's queued demand is reported, and how long a figure counts."""

    model_config = SettingsConfigDict(env_prefix="INVENTORY_", extra="ignore", frozen=True)

    period_s: float = Field(default=5.0, gt=0.0, le=600.0, description="How often each "
                            "non-local cluster's pending jobs are reported as queued demand.")
    ttl_periods: float = Field(
        default=3.0, ge=1.0, le=100.0,
        description="A figure counts for this many periods unless reported again: an "
                    "inventory that stops (or cannot reach the API server) stops counting.")
