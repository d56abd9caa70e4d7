"""Templater settings (env prefix TEMPLATER_; the task store's URL is DATABASE_URL)."""

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings
from services.store.settings import default_database_url


class TemplaterSettings(ServiceSettings):
    """Where templates come from, how often they are re-read, and dry-run mode."""

    model_config = SettingsConfigDict(env_prefix="TEMPLATER_", extra="ignore", frozen=True)

    template_dir: str = Field(default="", description="The templates seeded into the task "
                              "store when it lacks them; empty: the built-in templates.")
    dry_run: bool = Field(default=False, description="Tasks check everything but change nothing.")
    database_url: str = Field(
        default="", validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="The task store, where template versions live; empty: "
        "<state_dir>/warden.db.")
    reload_interval_s: float = Field(default=30.0, gt=0.0, le=3_600.0, description="The "
                                     "periodic re-read of the active versions (a safety net "
                                     "beside the change events).")

    @model_validator(mode="after")
    def _default_url(self) -> "TemplaterSettings":
        if not self.database_url:
            object.__setattr__(self, "database_url", default_database_url(self.state_dir))
        return self
