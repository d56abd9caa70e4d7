"""One realistic example of every event; `python -m tests.contracts.examples` rewrites goldens."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypedDict, TypeVar
from uuid import UUID

from schemas.envelope import Envelope
from schemas.events.v1 import (
    AddCapacity,
    Alert,
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    Evidence,
    Fault,
    GpuMetrics,
    HostMetrics,
    JobInfo,
    MigrateJobs,
    NodeReport,
    NodeState,
    OfflineNode,
    OpsNeed,
    OpsTask,
    PeerProbe,
    PoolHealth,
    Sample,
    SampleBatch,
    Step,
    TaskControl,
    TaskEvent,
    TaskScheduled,
)

GOLDEN = Path(__file__).parent / "golden"
T0 = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)
TASK = UUID("6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f")
NEED = UUID("0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d")
CMD = UUID("11111111-2222-4333-8444-555555555555")


def _uuid(n: int) -> UUID:
    return UUID(int=n, version=4)


class EnvelopeFields(TypedDict):
    """The envelope fields every example spells out (the rest take their defaults)."""

    event_id: UUID
    source: str
    occurred_at: datetime
    cluster_id: str
    subject: str


def envelope(n: int, source: str, subject: str) -> EnvelopeFields:
    return {"event_id": _uuid(n), "source": source, "occurred_at": T0, "cluster_id": "local",
            "subject": subject}


def examples() -> dict[str, Envelope]:
    evidence = Evidence(metric="node_fault_count", value=1.0, range_low=0.0, range_high=0.0,
                        observed_at=T0, source_event_id=_uuid(1), detail="2 consecutive; xid:79")
    task = OpsTask(
        **envelope(6, "templater", str(TASK)), task_id=TASK, need_id=NEED, need_kind="offline",
        template="offline.v1", target="node-002", priority=1, mutex_keys=["node.node-002"],
        steps=[Step(index=0, name="drain", action=DrainNode(node_id="node-002")),
               Step(index=1, name="offline", action=OfflineNode(node_id="node-002")),
               Step(index=2, name="add-capacity", action=AddCapacity(pool="default"),
                    guard="pool_above_range"),
               Step(index=3, name="migrate", action=MigrateJobs(pool="default",
                                                                node_id="node-002"),
                    guard="node_has_jobs", timeout_s=300.0)],
        evidence=[evidence],
    )
    payload = CommandPayload(command_id=CMD, node_id="node-002", seq=7, epoch=3, issued_at=T0,
                             expires_at=T0 + timedelta(seconds=60), task_id=TASK, step_index=0,
                             action=DrainNode(node_id="node-002"))
    sample = Sample(
        **envelope(2, "collector", "node-002"), node_id="node-002", pool="default", seq=42,
        reported_at=T0, report_event_id=_uuid(1), mode="active", gpu_count=1,
        gpu_utilization_pct=71.5, gpu_memory_pct=36.621, fault_count=1,
        faults=[Fault(kind="xid", code=79, gpu_index=0)], gpu_source="simulated",
    )
    return {
        "node_report": NodeReport(
            **envelope(1, "agent-node-002", "node-002"), node_id="node-002", seq=42,
            interval_s=2.0, gpu_source="simulated",
            gpus=[GpuMetrics(index=0, uuid="GPU-SIMULATED-0", name="Simulated GPU",
                             utilization_pct=71.5, memory_used_mib=30_000,
                             memory_total_mib=81_920, temperature_c=64.0, power_w=310.5,
                             ecc_uncorrected_volatile=0, xid_events=[79])],
            host=HostMetrics(cpu_pct=35.0, memory_used_mib=20_000, memory_total_mib=65_536,
                             disk_used_pct=41.0),
            faults=[Fault(kind="xid", code=79, gpu_index=0, detail="GPU has fallen off the bus")],
            jobs=[JobInfo(job_id="train-7", kind="training", state="running", progress_pct=12.5,
                          throughput=830.0, gpu_indices=[0])],
            peer_probes=[PeerProbe(peer_node_id="node-001", reachable=True, rtt_ms=0.4)],
        ),
        "sample": sample,
        "sample_batch": SampleBatch(**envelope(13, "collector", "local.reports-0"),
                                    samples=[sample]),
        "node_state": NodeState(
            **envelope(3, "collector", "node-003"), node_id="node-003", pool="default",
            state="down", previous="suspect", reason="no report for 31.0s", last_report_at=T0,
        ),
        "ops_need": OpsNeed(**envelope(4, "analyzer", "node-002"), kind="offline",
                            target="node-002", evidence=[evidence]),
        "ops_task": task,
        "task_scheduled": TaskScheduled(**envelope(7, "scheduler", str(TASK)), task=task, epoch=3),
        "command": Command(**envelope(8, "executor", "node-002"), kid="cw-AAAAAAAAAAAAAAAA",
                           payload="eyJjb21tYW5kX2lkIjoiIn0", sig="c2lnbmF0dXJl"),
        "command_result": CommandResult(
            **envelope(9, "agent-node-002", "node-002"), command_id=payload.command_id,
            node_id="node-002", task_id=TASK, step_index=0, action="drain_node",
            outcome="succeeded", outputs={"mode": "draining"},
        ),
        "task_event": TaskEvent(
            **envelope(10, "executor", str(TASK)), task_id=TASK, state="running",
            previous_state="running", step_index=0, step_state="completed", command_id=CMD,
            actor="executor", reason="drain completed", outputs={"mode": "draining"},
        ),
        "task_control": TaskControl(**envelope(11, "api", str(TASK)), task_id=TASK,
                                    action="pause", actor="alice", reason="investigating"),
        "pool_health": PoolHealth(
            **envelope(14, "analyzer", "default"), pool="default", nodes_total=10,
            nodes_by_state={"up": 8, "down": 1, "offline": 1}, unhealthy_fraction=0.1,
            gpu_utilization_pct=84.5, demand_pct=6.0, effective_utilization_pct=90.5,
        ),
        "alert": Alert(**envelope(12, "scheduler", "local"), severity="critical",
                       kind="breaker_open", dedup_key="breaker.local.offline",
                       message="3 failed offline adjustments in the window"),
    }


E = TypeVar("E", bound=Envelope)


def example(name: str, model: type[E]) -> E:
    """One example, typed as the model it is an instance of."""
    event = examples()[name]
    if not isinstance(event, model):
        raise TypeError(f"example {name!r} is a {type(event).__name__}, not a {model.__name__}")
    return event


def write_goldens() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, event in examples().items():
        text = json.dumps(json.loads(event.model_dump_json()), indent=2, sort_keys=True)
        (GOLDEN / f"{name}.json").write_text(text + "\n")


if __name__ == "__main__":
    write_goldens()
