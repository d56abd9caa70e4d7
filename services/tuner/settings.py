"""Tuner settings (env prefix TUNER_; the task store's URL is DATABASE_URL)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.store.settings import TaskStoreUser


class TunerSettings(TaskStoreUser):
    """How fast measures decay and how often tunable templates are looked at."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore", frozen=True)

    alpha: float = Field(default=0.05, gt=0.0, le=1.0, description="Weight of each new "
                         "sample in the decayed throughput per node.")
    period_s: float = Field(default=60.0, gt=0.0, le=86_400.0, description="How often the "
                            "tunable templates are checked against the measures.")
