"""Collector settings (env prefix COLLECTOR_)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.settings import ReportReaderSettings
from schemas.events.v1.values import REPORT_CLOCK_SKEW_S


class CollectorSettings(ReportReaderSettings):
    """How reports are batched, which timestamps are usable, and when a silent node is down."""

    model_config = SettingsConfigDict(env_prefix="COLLECTOR_", extra="ignore", frozen=True)

    batch_max_records: int = Field(default=500, ge=1, le=10_000)
    future_skew_s: float = Field(default=REPORT_CLOCK_SKEW_S, ge=0.0,
                                 description="Later than now + this: skewed.")
    bad_input_alert_window_s: float = Field(
        default=300.0, gt=0.0,
        description="At most one alert a window per node for reports refused as forged or "
                    "broken (a seq ahead of the clock).")
    stale_after_s: float = Field(default=600.0, gt=0.0, description="Older than this: stale.")
    suspect_after_intervals: float = Field(default=1.5, gt=1.0)
    down_after_s: float = Field(default=30.0, gt=0.0, description="Heartbeat grace period.")
    sweep_interval_s: float = Field(default=1.0, gt=0.0)
    probe_period_s: float = Field(
        default=60.0, gt=0.0, description="How often the centre probes each node."
    )
    probe_deadline_s: float = Field(
        default=5.0, gt=0.0, le=300.0, description="A probe not answered by then has failed."
    )
    signing_key: str = Field(
        default="",
        description="PEM Ed25519 private key of the collector's commands (probes, peers, report "
        "intervals); empty: <state_dir>/keys/collector.key (made if missing).",
    )
    day_interval_s: float | None = Field(
        default=None, ge=0.5, le=3_600.0,
        description="Report interval the centre sets by day (with night_interval_s; off if unset).",
    )
    night_interval_s: float | None = Field(default=None, ge=0.5, le=3_600.0)
    day_start_hour: int = Field(default=7, ge=0, le=23, description="UTC hour the day starts.")
    day_end_hour: int = Field(default=21, ge=0, le=23, description="UTC hour the day ends.")
    require_registration: bool = Field(
        default=True, description="Reports from nodes not enrolled are quarantined."
    )
    history_minutes: int = Field(
        default=1_440, ge=1, le=100_000, description="Per-node utilisation history kept."
    )
    peer_count: int = Field(
        default=3, ge=0, le=16,
        description="Peers each node is told to probe (a ring over the cluster's nodes); 0: "
        "the centre assigns none and agents find peers on their own host only.")
    peer_assign_period_s: float = Field(
        default=5.0, gt=0.0, le=3_600.0, description="How often assignments are checked.")
    min_peer_quorum: int = Field(
        default=2, ge=1, le=16,
        description="Distinct fresh probers that must agree before peer probes partition a "
        "node or spare a silent one (one lying node alone never decides).")
    peer_verdict_max_age_s: float = Field(
        default=30.0, gt=0.0, le=3_600.0,
        description="A prober's verdict counts while its report is younger than this.")
    peer_resend_s: float = Field(
        default=300.0, gt=0.0, le=86_400.0,
        description="An unchanged assignment is sent again after this long.")
    peer_address_max_age_s: float = Field(
        default=600.0, gt=0.0, le=86_400.0,
        description="A node silent longer than this is no longer assigned as a peer.")
