"""Capacity and centre-action settings (env prefix CAPACITY_)."""

from __future__ import annotations

import re
from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings

_NODE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class CapacitySettings(ServiceSettings):
    """Which provider gives capacity, the local standby nodes, and how centre steps run."""

    model_config = SettingsConfigDict(env_prefix="CAPACITY_", extra="ignore", frozen=True)

    provider: str = Field(default="local", description="local | none")
    local_standby: str = Field(
        default="",
        description='Standby nodes of the local provider: "standby-1:4,standby-2:8" '
        '(node:gpus), or a count ("2": standby-1, standby-2 with local_gpus GPUs each).',
    )
    local_gpus: int = Field(default=2, ge=1, le=64, description="GPUs of a counted standby node.")
    local_interval_s: float = Field(default=2.0, gt=0.0, le=3_600.0,
                                    description="Report interval of standby agents.")
    local_jobs: str = Field(default="", description="AGENT_JOBS of standby agents ('' for none).")
    local_state_dir: str = Field(default="",
                                 description="Fleet state directory; empty: WARDEN_STATE_DIR.")
    local_stop_timeout_s: float = Field(default=15.0, gt=0.0, le=300.0)
    target_util_pct: float | None = Field(
        default=None, ge=1.0, le=100.0,
        description="Utilisation a capacity change aims at; unset: the exit threshold of the "
        "side the pool left (75% out, 25% in with the default range).",
    )
    ready_timeout_s: float = Field(
        default=20.0, ge=0.0, le=300.0,
        description="How long adding capacity waits for the new nodes to report up "
        "(so the next step can place jobs on them); 0: does not wait.",
    )
    restart_timeout_s: float = Field(
        default=60.0, gt=0.0, le=600.0,
        description="How long a restarted agent has to send its first report before the "
        "restart_agent step fails (and is retried).")
    checkpoint_timeout_s: float = Field(default=20.0, gt=0.0, le=3_600.0)
    migrate_step_timeout_s: float = Field(default=120.0, gt=0.0, le=86_400.0)
    start_step_timeout_s: float = Field(default=120.0, gt=0.0, le=86_400.0)
    drain_step_timeout_s: float = Field(default=60.0, gt=0.0, le=86_400.0)
    children_step_timeout_s: float = Field(
        default=1_800.0, gt=0.0, le=86_400.0,
        description="How long a remove-node child waits for the migrations of its node's jobs.",
    )
    release_step_timeout_s: float = Field(default=120.0, gt=0.0, le=86_400.0)
    result_ttl_s: int = Field(
        default=7 * 86_400, ge=60,
        description="How long a centre step's result is kept, so a re-run returns it.",
    )

    @model_validator(mode="after")
    def _standby_parses(self) -> Self:
        self.standby_nodes()  # a bad list stops the service at start, naming the entry
        return self

    def standby_nodes(self) -> list[tuple[str, int]]:
        """The configured standby nodes as (node id, GPUs), in the order given."""
        spec = self.local_standby.strip()
        if not spec:
            return []
        if spec.isdigit():
            return [(f"standby-{i}", self.local_gpus) for i in range(1, int(spec) + 1)]
        nodes: list[tuple[str, int]] = []
        for entry in (part.strip() for part in spec.split(",")):
            name, _, gpus = entry.partition(":")
            if not _NODE.match(name) or (gpus and not gpus.isdigit()):
                raise ValueError(f"local_standby: bad entry {entry!r} (want node or node:gpus)")
            count = int(gpus) if gpus else self.local_gpus
            if not 1 <= count <= 64:
                raise ValueError(f"local_standby: {entry!r} needs 1..64 GPUs")
            if any(name == known for known, _ in nodes):
                raise ValueError(f"local_standby: {name!r} is listed twice")
            nodes.append((name, count))
        return nodes
