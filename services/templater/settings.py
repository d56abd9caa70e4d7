"""Templater settings (env prefix TEMPLATER_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings


class TemplaterSettings(ServiceSettings):
    """Where templates are read from, and whether tasks are made in dry-run mode."""

    model_config = SettingsConfigDict(env_prefix="TEMPLATER_", extra="ignore", frozen=True)

    template_dir: str = Field(default="", description="Empty: the built-in templates.")
    dry_run: bool = Field(default=False, description="Tasks check everything but change nothing.")
