"""Router settings (env prefix ROUTER_; the selector's knobs as ROUTER_POLICY__<KNOB>)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ReportReaderSettings
from services.router.policy.config import SelectorConfig


class RouterSettings(ReportReaderSettings):
    """How attempts are timed, how the registry ages, and the selector's configuration."""

    model_config = SettingsConfigDict(env_prefix="ROUTER_", extra="ignore", frozen=True,
                                      env_nested_delimiter="__")

    signing_key: str = Field(
        default="",
        description="PEM Ed25519 private key of the router's run_inference commands; empty: "
                    "<state_dir>/keys/router.key (made if missing).",
    )
    attempt_timeout_s: float = Field(
        default=3.0, gt=0.0, le=600.0,
        description="An attempt without an answer after this long (or at the task's deadline, "
                    "if sooner) has timed out.",
    )
    min_attempt_s: float = Field(
        default=0.05, gt=0.0, le=60.0,
        description="Less time than this before the deadline: no new attempt is started.",
    )
    wait_retry_s: float = Field(
        default=0.2, gt=0.0, le=60.0,
        description="A task nothing can take now (all saturated, none ready) is selected "
                    "again after this long, until its deadline.",
    )
    sweep_interval_s: float = Field(default=0.1, gt=0.0, le=60.0,
                                    description="How often due tasks are looked at.")
    task_gpus: float = Field(
        default=0.25, ge=0.0, le=64.0,
        description="GPUs a waiting task counts for in the queued demand (a model serves 4 "
                    "tasks at once by default, so a quarter of a GPU each).")
    demand_pool: str = Field(
        default="default", pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="The pool whose demand waiting ML tasks count in.")
    demand_period_s: float = Field(default=1.0, gt=0.0, le=600.0,
                                   description="How often waiting tasks are reported as demand.")
    registry_stale_after_s: float = Field(
        default=10.0, gt=0.0, le=3_600.0,
        description="A node's models count as not ready once its last report is older than "
                    "this, or three of its report intervals if longer.",
    )
    registry_forget_after_s: float = Field(
        default=600.0, gt=0.0, le=86_400.0,
        description="A node silent this long leaves the registry.",
    )
    require_registration: bool = Field(
        default=True,
        description="Only nodes enrolled in their cluster (as the collector requires) serve "
                    "tasks; their reports' models are ignored otherwise.",
    )
    registry_cache_s: float = Field(
        default=0.5, ge=0.0, le=60.0,
        description="How long one read of the registry is reused for decisions.",
    )
    breaker_cache_s: float = Field(
        default=1.0, ge=0.0, le=60.0,
        description="How long one read of the nodes stopped by circuit breakers is reused.",
    )
    batch_max_records: int = Field(
        default=500, ge=1, le=10_000,
        description="Reports the registry consumes (and applies in one round trip) at once.",
    )
    max_candidates: int = Field(
        default=24, ge=1, le=64,
        description="Candidates one decision looks at (ready ones and earlier fallback "
                    "groups first, a random sample of the rest): keeps decision events small.",
    )
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict,
        description='Per task type, the model families in fallback order, e.g. '
                    '{"digits": ["mlp", "logreg", "knn"]}; unlisted families come last. '
                    "Empty: every family in one group.",
    )
    record_ttl_s: int = Field(default=86_400, ge=60, le=30 * 86_400,
                              description="The longest a task's record stays in Redis.")
    finished_record_ttl_s: int = Field(
        default=3_600, ge=60, le=30 * 86_400,
        description="How long a finished task's record stays in Redis past its deadline "
                    "(at most record_ttl_s).")
    stats_ttl_s: int = Field(default=7 * 86_400, ge=60, le=365 * 86_400,
                             description="Statistics untouched this long are dropped.")
    policy: SelectorConfig = Field(
        default_factory=SelectorConfig,
        description="The selector's configuration (services/router/policy/config.py).")
