"""What the analyzer knows about a node at one moment: the input of every need."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from schemas.events.v1 import Fault, NodeStateName


class NodeObservation(BaseModel):
    """A node's state and fault data, with the event it came from (the need's evidence)."""

    model_config = ConfigDict(frozen=True)

    cluster_id: str
    node_id: str
    pool: str
    state: NodeStateName
    fault_count: int
    faults: tuple[Fault, ...] = ()
    consecutive_faulty: int = 0
    observed_at: datetime
    source_event_id: UUID
    reason: str = ""
