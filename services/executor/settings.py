"""Executor settings (env prefix EXECUTOR_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.shared.settings import ServiceSettings


class ExecutorSettings(ServiceSettings):
    """Signing key, command lifetime and how often step deadlines are checked."""

    model_config = SettingsConfigDict(env_prefix="EXECUTOR_", extra="ignore", frozen=True)

    signing_key: str = Field(
        default="",
        description="PEM Ed25519 private key; empty: <state_dir>/keys (made if missing).",
    )
    command_ttl_s: float = Field(default=120.0, gt=0.0, le=300.0)
    deadline_sweep_interval_s: float = Field(default=1.0, gt=0.0)
