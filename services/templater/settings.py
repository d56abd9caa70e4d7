"""Templater settings (env prefix TEMPLATER_; the task store's URL is DATABASE_URL)."""


from uuid import uuid4

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.store.settings import TaskStoreUser


class TemplaterSettings(TaskStoreUser):
    """Where templates come from, how often they are re-read, and dry-run mode."""

    model_config = SettingsConfigDict(env_prefix="TEMPLATER_", extra="ignore", frozen=True)

    template_dir: str = Field(default="", description="The templates seeded into the task "
                              "store when it lacks them; empty: the built-in templates.")
    dry_run: bool = Field(default=False, description="Tasks check everything but change nothing.")
    reload_interval_s: float = Field(default=30.0, gt=0.0, le=3_600.0, description="The "
                                     "periodic re-read of the active versions (a safety net "
                                     "beside the change events).")
    instance: str = Field(
        default_factory=lambda: uuid4().hex[:12], pattern=r"^[A-Za-z0-9_-]{1,32}$",
        description="This process's own consumer group for template changes "
        "(templater-changes-<instance>): every instance must hear every change.")
