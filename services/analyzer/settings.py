"""Analyzer settings (env prefix ANALYZER_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.analyzer.needs.offline import Args as OfflineArgs
from services.shared.settings import ServiceSettings


class AnalyzerSettings(ServiceSettings):
    """Which needs run, with which arguments, and how long a raised need stays open."""

    model_config = SettingsConfigDict(
        env_prefix="ANALYZER_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    enabled_needs: list[str] = Field(default_factory=lambda: ["offline"])
    offline: OfflineArgs = Field(default_factory=OfflineArgs)
    open_need_ttl_s: int = Field(
        default=600, ge=1, description="A raised need is not raised again for this long."
    )
