"""API settings (env prefix API_)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from common.settings import ReportReaderSettings

DEFAULT_PORT = 18080


class ApiSettings(ReportReaderSettings):
    """Where the API listens, who may call it, where it finds templates and the console, and
    the report master it enrols nodes under."""

    model_config = SettingsConfigDict(env_prefix="API_", extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65_535)
    tokens: SecretStr = Field(
        default=SecretStr(""),
        description='"<token>:<user>:<role>,..." (or "sha256=<hex digest>:<user>:<role>"); '
                    "roles node (enrolment only) < viewer < operator < admin.",
    )
    tokens_file: str = Field(
        default="", description="A file of the same entries, one a line (# comments)."
    )
    # The templater's own setting, so that what the API edits is what the templater reads.
    template_dir: str = Field(
        default="",
        validation_alias=AliasChoices("TEMPLATER_TEMPLATE_DIR", "template_dir"),
        description="Empty: <WARDEN_STATE_DIR>/templates, seeded from the built-in ones.",
    )
    database_url: str = Field(
        default="",
        validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="The task store; empty: <WARDEN_STATE_DIR>/warden.db (SQLite).",
    )
    console_dir: str = Field(default="", description="Empty: the built-in web console.")
    forecast_ttl_s: float = Field(
        default=300.0, ge=0.0, le=86_400.0,
        description="How long a pool's forecast is reused (it is hourly; a fit costs CPU).",
    )
    publish_timeout_s: float = Field(
        default=15.0, gt=0.0, le=120.0,
        description="How long a control waits for Kafka before answering 503.",
    )
