"""Alerts service settings (env prefix ALERTS_; the store's URL is DATABASE_URL)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from services.store.settings import StoreSettings


class AlertsSettings(StoreSettings):
    """Where alerts go, and how often a firing one is sent again."""

    model_config = SettingsConfigDict(env_prefix="ALERTS_", extra="ignore", frozen=True)

    alertmanager_url: str = Field(
        default="",
        validation_alias=AliasChoices("ALERTMANAGER_URL", "alertmanager_url"),
        description="Base URL of Alertmanager (http://host:9093); empty: alerts are only "
                    "kept in the store and sent to the webhooks.",
    )
    webhook_urls: list[str] = Field(
        default_factory=list,
        description="URLs every change of an alert is POSTed to, in Alertmanager's webhook "
                    "format (JSON list in the environment).",
    )
    webhook_secret: str = Field(
        default="",
        description="When set, each webhook body is signed: X-ClusterWarden-Signature is "
                    "sha256=<hex HMAC-SHA256 of the body>.",
    )
    resend_interval_s: float = Field(
        default=60.0, gt=0.0, le=3_600.0,
        description="How often firing alerts are sent again (their endsAt is four of these "
                    "ahead, so Alertmanager resolves an alert whose sender stopped).",
    )
    delivery_interval_s: float = Field(
        default=5.0, gt=0.0, le=600.0,
        description="How often undelivered changes are tried again and due resends sent.",
    )
    delivery_timeout_s: float = Field(default=5.0, gt=0.0, le=60.0)
    console_url: str = Field(
        default="",
        validation_alias=AliasChoices("ALERTS_CONSOLE_URL", "WARDEN_CONSOLE_URL", "console_url"),
        description="The console's URL, linked from each alert (generatorURL).",
    )
