"""One realistic example of every event; `python -m tests.contracts.examples` rewrites goldens."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict, TypeVar
from uuid import UUID

from schemas.envelope import Envelope
from schemas.events.v1 import (
    AddCapacity,
    Alert,
    CandidateVerdict,
    CapacityPlan,
    Command,
    CommandPayload,
    CommandResult,
    Dependency,
    DrainNode,
    Evidence,
    ExclusiveWith,
    Fault,
    GpuMetrics,
    HostMetrics,
    JobInfo,
    MigrateJobs,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    NodeReport,
    NodeState,
    OfflineNode,
    OpsNeed,
    OpsTask,
    PeerProbe,
    PlanDay,
    PoolHealth,
    PoolPlan,
    ProcurementStep,
    Sample,
    SampleBatch,
    SelectionAvoid,
    SelectionCandidate,
    SelectionInputs,
    SelectionTask,
    ServedModel,
    Step,
    TaskControl,
    TaskEvent,
    TaskRelations,
    TaskScheduled,
    TemplateChanged,
)
from schemas.ranges import Band, Ranges

GOLDEN = Path(__file__).parent / "golden"
T0 = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)
TASK = UUID("6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f")
NEED = UUID("0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d")
CMD = UUID("11111111-2222-4333-8444-555555555555")
ML_TASK = UUID("7a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d")
ML_CMD = UUID("22222222-3333-4444-8555-666666666666")
# A held-out 0 of the digits (pixel counts 0..16), as `warden submit --digit` sends them.
DIGIT = [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0, 0.0, 0.0, 13.0, 15.0, 10.0, 15.0, 5.0, 0.0,
         0.0, 3.0, 15.0, 2.0, 0.0, 11.0, 8.0, 0.0, 0.0, 4.0, 12.0, 0.0, 0.0, 8.0, 8.0, 0.0,
         0.0, 5.0, 8.0, 0.0, 0.0, 9.0, 8.0, 0.0, 0.0, 4.0, 11.0, 0.0, 1.0, 12.0, 7.0, 0.0,
         0.0, 2.0, 14.0, 5.0, 10.0, 12.0, 0.0, 0.0, 0.0, 0.0, 6.0, 13.0, 10.0, 0.0, 0.0, 0.0]
NOW_S = T0.timestamp()


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
    # An operator's pool range, not the default: what the need was raised under travels on.
    ranges = Ranges(pool=Band(low_enter=30.0, low_exit=35.0, high_enter=70.0, high_exit=65.0),
                    node=Band())
    task = OpsTask(
        **envelope(6, "templater", str(TASK)), task_id=TASK, need_id=NEED, need_kind="offline",
        template="offline.v1", target="node-002", priority=1, mutex_keys=["node.node-002"],
        steps=[Step(index=0, name="drain", action=DrainNode(node_id="node-002"),
                    execution_count=1),
               Step(index=1, name="offline", action=OfflineNode(node_id="node-002"),
                    execution_count=1),
               Step(index=2, name="add-capacity", action=AddCapacity(pool="default"),
                    guard="pool_above_range"),
               Step(index=3, name="migrate", action=MigrateJobs(pool="default",
                                                                node_id="node-002"),
                    guard="node_has_jobs", timeout_s=300.0)],
        evidence=[evidence],
        ranges=ranges,
        execution_count=1,
        relations=TaskRelations(
            # As the built-in offline template's, plus two relations to templates no test
            # loads, so tasks made from this example are held by nothing else.
            template="offline", concurrency=16,
            concurrent_with=["load_balance", "online", "scale_out", "scale_in"],
            exclusive_with=[ExclusiveWith(template="firmware_update", scope="pool")],
            depends_on=[Dependency(template="rack_check", scope="target",
                                   on_failure="proceed")]),
    )
    payload = CommandPayload(command_id=CMD, cluster_id="local", node_id="node-002", seq=7,
                             epoch=3, issued_at=T0,
                             expires_at=T0 + timedelta(seconds=60), task_id=TASK, step_index=0,
                             action=DrainNode(node_id="node-002"))
    sample = Sample(
        **envelope(2, "collector", "node-002"), node_id="node-002", pool="default", seq=42,
        reported_at=T0, report_event_id=_uuid(1), mode="active", gpu_count=1,
        gpu_utilization_pct=71.5, gpu_memory_pct=36.621, fault_count=1,
        faults=[Fault(kind="xid", code=79, gpu_index=0)], gpu_source="simulated",
        job_throughput=118.4, node_type="Simulated GPU",
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
            probe_address="10.0.0.2:7101",
            models=[ServedModel(task_type="digits", model="digits-mlp", version="2",
                                family="mlp", state="ready", max_concurrency=4,
                                accuracy=0.975)],
        ),
        "sample": sample,
        "sample_batch": SampleBatch(**envelope(13, "collector", "local.reports-0"),
                                    samples=[sample]),
        "node_state": NodeState(
            **envelope(3, "collector", "node-003"), node_id="node-003", pool="default",
            state="down", previous="suspect", reason="no report for 31.0s", last_report_at=T0,
        ),
        "ops_need": OpsNeed(**envelope(4, "analyzer", "node-002"), kind="offline",
                            target="node-002", evidence=[evidence], ranges=ranges),
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
        "ml_task_submitted": MlTaskSubmitted(
            **envelope(15, "api", str(ML_TASK)), task_id=ML_TASK, task_type="digits",
            input=DIGIT, deadline=T0 + timedelta(seconds=10), priority=5,
            submitted_by="alice"),
        "model_selected": model_selected(),
        "ml_task_outcome": MlTaskOutcome(
            **envelope(17, "router", str(ML_TASK)), task_id=ML_TASK, task_type="digits",
            attempt=1, node_id="node-002", model="digits-mlp", version="2", family="mlp",
            command_id=ML_CMD, outcome="succeeded", latency_ms=21.5, node_latency_ms=0.4,
            prediction=0, confidence=0.998, final=True, state="succeeded",
            reason="digits-mlp:2 on node-002 answered 0"),
        "alert": Alert(**envelope(12, "scheduler", "local"), severity="critical",
                       kind="breaker_open", dedup_key="breaker.local.offline",
                       message="3 failed offline adjustments in the window"),
        "capacity_plan": capacity_plan(),
        "template_changed": TemplateChanged(
            **envelope(18, "store", "scale_out"), template="scale_out", version=2,
            change="version", origin="tuned", actor="tuner",
            reason="measured 104.0 per node (was 50.0): nodes_per_scale_out 2 -> 1"),
    }


def capacity_plan() -> CapacityPlan:
    """A pool of ten 8-GPU nodes whose peak leaves the range on its second day."""
    day = T0.replace(hour=0, minute=0, second=0, microsecond=0)
    days = [
        PlanDay(day=day, peak_pct=74.0, lower_80=70.0, upper_80=78.0, lower_95=68.0,
                upper_95=80.0, nodes_mean=10, nodes_upper_80=11),
        PlanDay(day=day + timedelta(days=1), peak_pct=82.0, lower_80=76.0, upper_80=88.0,
                lower_95=73.0, upper_95=91.0, nodes_mean=11, nodes_upper_80=12),
    ]
    order = ProcurementStep(
        needed_by=day, order_by=day, node_type="8gpu", gpus_per_node=8, nodes=2, gpus=16,
        basis="upper_80", late=True,
        reason="8gpu x2 (16 GPUs) by 2026-11-30: the upper_80 peak needs 12 nodes within 2 "
               "days (10 planned); the lead time has already run out: order now")
    plan = PoolPlan(
        generated_at=T0, horizon_days=2, model="MSTL(7d) + ETS(A,Ad,N) on the daily means",
        history_days=90, history_from=day - timedelta(days=90), peak_uplift_pct=6.5,
        band=Band(), nodes_now=10, gpus_now=80, node_type="8gpu", gpus_per_node=8,
        lead_time_days=42, leaves_range_at=day + timedelta(days=1),
        leaves_range_at_upper_80=day + timedelta(days=1), days=days, procurement=[order])
    return CapacityPlan(**envelope(18, "analyzer", "default"), pool="default", plan=plan)


def model_selected() -> ModelSelected:
    """A decision between two arms: one eligible and chosen, one quarantined."""
    mlp, logreg = "arm:digits-mlp:2@node-002", "arm:digits-logreg:1@node-001"
    common: dict[str, Any] = {"group": 0, "inflight": 0, "limit": 4, "on_time": 1.0,
                              "avoided": 0}
    return ModelSelected(
        **envelope(16, "router", str(ML_TASK)), task_id=ML_TASK, task_type="digits",
        attempt=1, status="selected", chosen=mlp, model="digits-mlp", version="2",
        family="mlp", node="node-002", command_id=ML_CMD,
        reason="group 0; best score 0.962 (Thompson sample 0.962, mean 0.941)",
        policy_version="1", now=NOW_S, seed=1234567,
        candidates=[
            CandidateVerdict(arm=logreg, model="digits-logreg:1", node="node-001",
                             family="logreg", eligible=False,
                             reason=f"quarantined until {NOW_S + 12.5:.3f} "
                                    "(consecutive, level 1)",
                             state="open", alpha=4.1, beta=3.9, n_eff=4.0, mean=0.5125,
                             lower=0.25, upper=0.77, prior_mean=0.9, model_mean=0.95,
                             node_mean=0.947, latency_s=0.02, sample=None, score=None,
                             **common),
            CandidateVerdict(arm=mlp, model="digits-mlp:2", node="node-002", family="mlp",
                             eligible=True, reason="chosen", state="closed", alpha=16.6,
                             beta=1.0, n_eff=13.0, mean=0.941, lower=0.78, upper=0.99,
                             prior_mean=0.9, model_mean=0.95, node_mean=0.947,
                             latency_s=0.015, sample=0.962, score=0.962, **common),
        ],
        inputs=SelectionInputs(
            task=SelectionTask(task_id=str(ML_TASK), task_type="digits", priority=5,
                               deadline=NOW_S + 10.0, critical=False, attempt=1,
                               avoid=SelectionAvoid()),
            candidates=[
                SelectionCandidate(model="digits-logreg:1", node="node-001",
                                   family="logreg", group=0, ready=True, max_ongoing=4),
                SelectionCandidate(model="digits-mlp:2", node="node-002", family="mlp",
                                   group=0, ready=True, predecessor="digits-mlp:1",
                                   max_ongoing=4),
            ],
            snapshot={f"{logreg}|model_fault": 4.0, f"{logreg}|consecutive": 3.0,
                      f"{logreg}|quarantined": 1.0, f"{logreg}|q_until": NOW_S + 12.5,
                      f"{mlp}|ok": 13.0, f"{mlp}|updated": NOW_S - 1.0,
                      "global|ok": 120.0, "global|model_fault": 4.0,
                      "global|updated": NOW_S - 1.0},
            now=NOW_S, seed=1234567, config={"policy_version": "1", "half_life_s": 60.0},
        ),
    )


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
