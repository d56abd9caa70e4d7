"""Analyzer settings (env prefix ANALYZER_; nested arguments with `__`, e.g.
ANALYZER_SCALE__HOLD_S=30)."""

from typing import Any, Self

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings
from schemas.ranges import Band, Ranges
from services.analyzer.needs.load_balance import Args as LoadBalanceArgs
from services.analyzer.needs.offline import Args as OfflineArgs
from services.analyzer.needs.online import Args as OnlineArgs
from services.analyzer.needs.restart_agent import Args as RestartAgentArgs
from services.analyzer.needs.scale import Args as ScaleArgs
from services.analyzer.planning import PlanningArgs


class AnalyzerSettings(ServiceSettings):
    """Which needs run, with which arguments, and how often pools are analysed."""

    model_config = SettingsConfigDict(
        env_prefix="ANALYZER_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    enabled_needs: list[str] = Field(
        default_factory=lambda: ["offline", "restart_agent", "online", "load_balance",
                                 "scale"]
    )
    offline: OfflineArgs = Field(default_factory=OfflineArgs)
    restart_agent: RestartAgentArgs = Field(default_factory=RestartAgentArgs)
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
    planning: PlanningArgs = Field(default_factory=PlanningArgs,
                                   description="The capacity-planning loop (planning.py).")
    storage_weight: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="The share of storage use in a node's and a pool's load (the rest is GPU "
                    "use): 0 (the default) leaves storage out, 0.2 makes a full disk count "
                    "for a fifth of the load.")
    overrides: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description='Per cluster or pool: {"<cluster>" or "<cluster>/<pool>": {"<need>": '
        '{<arg>: value}}}; a pool entry wins over its cluster\'s, both over the defaults.',
    )

    @model_validator(mode="after")
    def _overrides_are_valid(self) -> Self:
        # Checked at start, so a bad override stops the service with the field named.
        for scope, needs in self.overrides.items():
            for need, changes in needs.items():
                base = getattr(self, need, None)
                if not isinstance(base, BaseModel):
                    raise ValueError(f"overrides[{scope!r}]: unknown need {need!r}")
                type(base).model_validate(base.model_dump() | changes)
        return self

    def args_for(self, need: str, cluster: str, pool: str) -> BaseModel:
        """A need's arguments for one pool: defaults, then cluster, then pool overrides."""
        base: BaseModel = getattr(self, need)
        changes = (self.overrides.get(cluster, {}).get(need, {})
                   | self.overrides.get(f"{cluster}/{pool}", {}).get(need, {}))
        return type(base).model_validate(base.model_dump() | changes) if changes else base

    def ranges_for(self, cluster: str, pool: str) -> Ranges:
        """The pool (scale) and node (load balance) ranges of one pool, as needs carry them
        to the executor's guards."""
        return Ranges(pool=self._band_for("scale", cluster, pool),
                      node=self._band_for("load_balance", cluster, pool))

    def _band_for(self, need: str, cluster: str, pool: str) -> Band:
        args = self.args_for(need, cluster, pool)
        if not isinstance(args, Band):
            raise TypeError(f"{need} arguments are not a range: {type(args).__name__}")
        return args.band()
