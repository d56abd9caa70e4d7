"""Scheduler settings (env prefix SCHEDULER_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings
from schemas.events.v1.values import REPORT_CLOCK_SKEW_S
from services.scheduler import safety
from services.scheduler.breaker import DEFAULT_DISRUPTIVE_KINDS, BreakerConfig, BreakerScope


class SchedulerSettings(ServiceSettings):
    """Dispatch cadence, lease length and the safety limits (docs/reliability.md §Safety limits)."""

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
                                description="Outcomes the breaker's failure rate looks at.")
    breaker_window_s: float = Field(
        default=3_600.0, gt=0.0, le=30 * 86_400.0,
        description="An outcome older than this no longer counts (rate or run of failures).")
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
        description="Task kinds whose breaker only an admin reset closes; also the kinds the "
                    "pool short-circuit holds back.",
    )
    breaker_scope: BreakerScope = Field(
        default="kind",
        description="What a kind's failures stop, unless `breaker_scopes` or the task's "
                    "template says otherwise. kind: that kind in the cluster; node: the "
                    "failing node (ops tasks and ML routing); cluster: every task of it.",
    )
    breaker_scopes: dict[str, BreakerScope] = Field(
        default_factory=dict, description="Per task kind, its scope: {\"offline\": \"node\"}.")

    rate_per_s: float = Field(
        default=0.1, gt=0.0, le=1_000.0,
        description="Tokens a second of each rate-limited kind per cluster (k8s eviction rate).",
    )
    rate_burst: int = Field(default=2, ge=1, le=1_000,
                            description="Tasks of a rate-limited kind that may start at once.")
    rate_limited_kinds: tuple[str, ...] = Field(
        default=("offline", "scale_in", "remove_node"),
        description="Task kinds that take a token; one finding none waits in the queue.",
    )
    budget_kinds: tuple[str, ...] = Field(
        default=("offline", "remove_node"),
        description="Task kinds that take a node out of service: they spend the pool's "
                    "offline budget.",
    )

    short_circuit_unhealthy_fraction: float = Field(
        default=safety.DEFAULT_UNHEALTHY_FRACTION, ge=0.0, le=1.0,
        description="Above this share of a pool unhealthy, no disruptive task is dispatched.",
    )
    pool_health_max_age_s: float = Field(
        default=safety.DEFAULT_MAX_AGE_S, gt=0.0, le=86_400.0,
        description="Older pool health counts as none: disruptive tasks wait (fail closed).",
    )
    future_skew_s: float = Field(
        default=REPORT_CLOCK_SKEW_S, ge=0.0,
        description="Pool health dated further ahead of the clock than this is refused.")
    pool_health_ttl_s: int = Field(default=600, ge=1, le=86_400,
                                   description="How long the latest pool health is kept.")
    offline_budget_fraction: float = Field(
        default=safety.DEFAULT_BUDGET_FRACTION, gt=0.0, le=1.0,
        description="Share of a pool automation may take offline at once (rounded up).",
    )
    short_circuit_alert_ttl_s: int = Field(
        default=900, ge=1, le=86_400,
        description="A short-circuit episode ends after this long without a refusal.",
    )

    def scope_of(self, kind: str, template_scope: BreakerScope | None = None) -> BreakerScope:
        """The scope of kind `kind`'s breaker: the template's, else the kind's, else the
        default."""
        return template_scope or self.breaker_scopes.get(kind, self.breaker_scope)

    def breaker_config(self, kind: str) -> BreakerConfig:
        """The breaker limits for tasks of kind `kind` (`OpsTask.kind`)."""
        return BreakerConfig(
            window=self.breaker_window, min_calls=self.breaker_min_calls,
            failure_rate_pct=self.breaker_failure_rate_pct,
            consecutive_failures=self.breaker_consecutive_failures,
            window_s=self.breaker_window_s,
            wait_s=self.breaker_wait_s, max_half_open_s=self.breaker_max_half_open_s,
            disruptive=kind in self.breaker_disruptive_kinds,
        )
