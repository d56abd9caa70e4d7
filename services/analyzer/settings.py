"""Analyzer settings (env prefix ANALYZER_; nested arguments with `__`, e.g.
ANALYZER_SCALE__HOLD_S=30)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.analyzer.needs.load_balance import Args as LoadBalanceArgs
from services.analyzer.needs.offline import Args as OfflineArgs
from services.analyzer.needs.online import Args as OnlineArgs
from services.analyzer.needs.scale import Args as ScaleArgs
from services.shared.settings import ServiceSettings


class AnalyzerSettings(ServiceSettings):
    """Which needs run, with which arguments, and how often pools are analysed."""

    model_config = SettingsConfigDict(
        env_prefix="ANALYZER_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    enabled_needs: list[str] = Field(
        default_factory=lambda: ["offline", "online", "load_balance", "scale"]
    )
    offline: OfflineArgs = Field(default_factory=OfflineArgs)
    online: OnlineArgs = Field(default_factory=OnlineArgs)
    load_balance: LoadBalanceArgs = Field(default_factory=LoadBalanceArgs)
    scale: ScaleArgs = Field(default_factory=ScaleArgs)
    open_need_ttl_s: int = Field(
        default=600, ge=1, description="A raised need is not raised again for this long."
    )
    pool_period_s: float = Field(
        default=5.0, gt=0.0, description="How often pools (the cluster level) are analysed."
    )
    dry_run: bool = Field(default=False, description="Raise needs marked not to be acted on.")
