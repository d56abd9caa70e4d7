"""Executor settings (env prefix EXECUTOR_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ReportReaderSettings


class ExecutorSettings(ReportReaderSettings):
    """Signing key, command lifetime, deadlines, retries and recovery."""

    model_config = SettingsConfigDict(env_prefix="EXECUTOR_", extra="ignore", frozen=True)

    signing_key: str = Field(
        default="",
        description="PEM Ed25519 private key of the executor's commands (task steps); empty: "
        "<state_dir>/keys/executor.key (made if missing).",
    )
    command_ttl_s: float = Field(default=120.0, gt=0.0, le=300.0)
    deadline_sweep_interval_s: float = Field(default=1.0, gt=0.0)
    lock_renew_interval_s: float = Field(
        default=30.0, gt=0.0,
        description="How often a running task's locks are renewed (to its worst-case TTL).")
    backend_warm_interval_s: float = Field(
        default=10.0, gt=0.0,
        description="How often the backends of clusters registered with one are opened if "
                    "they are not (their lists and watches ready before a step needs them).")
    backoff_base_s: float = Field(
        default=1.0, gt=0.0, le=3_600.0,
        description="Delay before the 2nd attempt of a step; doubled for each later one.",
    )
    backoff_max_s: float = Field(default=30.0, gt=0.0, le=86_400.0,
                                 description="The longest delay between two attempts.")
    status_query_timeout_s: float = Field(
        default=10.0, gt=0.0, le=300.0,
        description="How long an agent has to answer a status query about a late command.",
    )
    max_status_queries: int = Field(
        default=3, ge=1, le=20,
        description="Status queries (or centre re-runs) per attempt before it times out; "
        "each 'in progress' answer extends the deadline by the step's timeout.",
    )
    start_grace_s: float = Field(
        default=10.0, gt=0.0, le=3_600.0,
        description="A scheduled step not started within this (its starter died) is "
        "started by the sweep.",
    )
    lock_margin_s: float = Field(
        default=600.0, ge=0.0,
        description="Added to a task's worst-case run time for the TTL of locks taken again "
        "on retry or resume (as the scheduler does at dispatch).",
    )
    crash_at: str = Field(
        default="",
        description="Fault-injection hook for tests only: 'after_send:<action>' makes the "
        "process exit at once (os._exit(137), as a kill -9) right after it published the "
        "command of a step with that action. Empty: off.",
    )
