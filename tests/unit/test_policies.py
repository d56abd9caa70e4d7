"""Table tests of the pure policies: collector, needs, templates, scheduling, dead letters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from common.deadletter import classify
from common.errors import PermanentError, TransientError
from schemas.events.v1 import (
    Fault,
    JobInfo,
    NodeReport,
    NodeStateName,
    OpsNeed,
    OpsTask,
    Sample,
)
from services.analyzer.needs import REGISTRY, enabled
from services.analyzer.needs.offline import Args, detect
from services.analyzer.observation import NodeObservation
from services.collector import policy as collector
from services.scheduler import policy as scheduler
from services.shared.locks import lock_ttl_s
from services.templater.templates import TemplateError, load_template, load_templates, plan
from tests.contracts.examples import example

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("age_s", "verdict"),
    [(0, "ok"), (-29, "ok"), (-31, "future"), (599, "ok"), (601, "stale")],
)
def test_timestamp_verdict(age_s: float, verdict: str) -> None:
    at = NOW - timedelta(seconds=age_s)
    assert collector.timestamp_verdict(at, NOW, 30.0, 600.0) == verdict


@pytest.mark.parametrize(
    ("silent_s", "state"), [(1.0, "up"), (3.0, "suspect"), (29.9, "suspect"), (30.0, "down")]
)
def test_heartbeat_state(silent_s: float, state: str) -> None:
    assert collector.heartbeat_state(silent_s, 2.0, 1.5, 30.0) == state


@pytest.mark.parametrize(
    ("state", "due"), [("up", 103.0), ("suspect", 130.0), ("down", None)]
)
def test_next_heartbeat_check(state: NodeStateName, due: float | None) -> None:
    assert collector.next_heartbeat_check(100.0, 2.0, state, 1.5, 30.0) == due


def test_summary_of_a_report() -> None:
    report = example("node_report", NodeReport)
    sample = collector.summarize(report, "collector", NOW)
    assert sample.fault_count == 1
    assert sample.gpu_utilization_pct == 71.5
    assert sample.report_event_id == report.event_id
    # Built without validation for speed, so prove it would validate, field for field.
    assert Sample.model_validate_json(sample.model_dump_json()) == sample
    # Deterministic id: a redelivered report yields the same sample.
    assert sample.event_id == collector.summarize(report, "collector", NOW).event_id


def test_a_sample_carries_the_work_its_node_delivers_and_its_node_type() -> None:
    report = example("node_report", NodeReport)
    jobs = [JobInfo(job_id="a", kind="training", state="running", throughput=40.0),
            JobInfo(job_id="b", kind="inference", state="running", throughput=2.5),
            JobInfo(job_id="c", kind="training", state="checkpointing", throughput=99.0)]
    sample = collector.summarize(report.model_copy(update={"jobs": jobs}), "collector", NOW)
    # Running jobs only: a checkpointing job's last figure is not work being done.
    assert (sample.job_throughput, sample.node_type) == (42.5, report.gpus[0].name)
    assert Sample.model_validate_json(sample.model_dump_json()) == sample
    bare = collector.summarize(report.model_copy(update={"gpus": []}), "collector", NOW)
    assert bare.node_type == "unknown"


@pytest.mark.parametrize(
    ("job", "movable"),
    [
        ({}, True),
        ({"state": "starting"}, True),
        ({"gang": True}, False),
        ({"whole_node": True}, False),
        ({"do_not_disrupt": True}, False),
        ({"state": "checkpointing"}, None),  # neither: not doing work another node could take
        ({"state": "hung"}, None),
    ],
)
def test_a_sample_counts_the_jobs_that_can_move_and_those_that_cannot(
    job: dict[str, object], movable: bool | None
) -> None:
    report = example("node_report", NodeReport)
    info = JobInfo.model_validate({"job_id": "j1", "kind": "training", "state": "running"} | job)
    sample = collector.summarize(report.model_copy(update={"jobs": [info]}), "collector", NOW)
    assert (sample.movable_jobs, sample.pinned_jobs) == {
        True: (1, 0), False: (0, 1), None: (0, 0)}[movable]
    assert Sample.model_validate_json(sample.model_dump_json()) == sample


def obs(state: NodeStateName = "up", faults: int = 1, run: int = 2) -> NodeObservation:
    return NodeObservation(
        cluster_id="local", node_id="node-002", pool="default", state=state,
        fault_count=faults, faults=tuple(Fault(kind="xid", code=79) for _ in range(faults)),
        consecutive_faulty=run, observed_at=NOW, source_event_id=uuid4(),
        reason="no report for 31s" if state == "down" else "",
    )


@pytest.mark.parametrize(
    ("observation", "raised"),
    [
        (obs(faults=0, run=0), False),
        (obs(faults=1, run=1), False),  # one bad report is never enough
        (obs(faults=1, run=2), True),
        (obs(state="draining", faults=1, run=5), False),  # already leaving service
        (obs(state="offline", faults=1, run=5), False),
        (obs(state="down", faults=0, run=0), True),  # heartbeat missed beyond the grace
    ],
)
def test_offline_need(observation: NodeObservation, raised: bool) -> None:
    needs = detect(observation, Args(), NOW, "analyzer")
    assert bool(needs) is raised
    if needs:
        assert needs[0].kind == "offline"
        assert needs[0].target == "node-002"
        assert needs[0].evidence[0].source_event_id == observation.source_event_id


def test_fault_range_is_an_argument() -> None:
    assert detect(obs(faults=2, run=3), Args(fault_max=2), NOW, "analyzer") == []
    assert detect(obs(faults=3, run=3), Args(fault_max=2), NOW, "analyzer")


def test_need_registry_is_explicit() -> None:
    assert [m.name for m in REGISTRY] == ["offline", "restart_agent", "online", "load_balance",
                                          "scale"]
    with pytest.raises(ValueError, match="unknown needs"):
        enabled(["offline", "teleport"])


def need() -> OpsNeed:
    return example("ops_need", OpsNeed)


def test_offline_template_plans_drain_then_offline() -> None:
    template = load_templates()["offline"]
    task = plan(template, need(), NOW, "templater")
    assert [s.action.action for s in task.steps][:2] == ["drain_node", "offline_node"]
    assert all(getattr(s.action, "node_id", None) == "node-002" for s in task.steps[:2])
    assert task.mutex_keys[0] == "node.local.node-002"
    assert task.evidence == need().evidence
    # The same need always makes the same task (idempotent under redelivery).
    assert plan(template, need(), NOW + timedelta(seconds=5), "templater").task_id == task.task_id


def test_bad_template_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nversion: 1\nneed: offline\ndescription: x\npriority: 12\n"
                    "mutex: ['node.{cluster}.{target}']\nsteps:\n  - name: a\n"
                    "    action: exec_shell\n")
    with pytest.raises(TemplateError) as err:
        load_template(path)
    assert "broken.yaml" in str(err.value)
    assert "priority" in str(err.value)
    assert "steps.0.action" in str(err.value)


def test_queue_score_orders_by_priority_then_age() -> None:
    task = example("ops_task", OpsTask)
    urgent = task.model_copy(update={"priority": 0})
    later = task.model_copy(update={"occurred_at": task.occurred_at + timedelta(seconds=1)})
    assert scheduler.queue_score(urgent) < scheduler.queue_score(task)
    assert scheduler.queue_score(task) < scheduler.queue_score(later)


def test_lock_ttl_covers_the_worst_case_run() -> None:
    task = example("ops_task", OpsTask)
    # Three 60 s agent steps and a 300 s migration, three attempts each, plus the margin.
    assert lock_ttl_s(task, 600.0) == (3 * 60.0 + 300.0) * 3 + 600.0


@pytest.mark.parametrize(
    ("error", "disposition", "reason"),
    [
        (PermanentError("unknown_node", "node-9"), "dead_letter", "unknown_node"),
        (TransientError("busy"), "dead_letter", "retries_exhausted"),
        (RedisConnectionError("refused"), "wait", "infrastructure_unavailable"),
        (KafkaConnectionError("down"), "wait", "infrastructure_unavailable"),
        (ZeroDivisionError("bug"), "dead_letter", "unhandled_error"),
    ],
)
def test_failure_classification(error: Exception, disposition: str, reason: str) -> None:
    assert classify(error)[:2] == (disposition, reason)


def test_validation_errors_are_permanent() -> None:
    with pytest.raises(ValidationError) as err:
        OpsNeed.model_validate_json(b"{}")
    assert classify(err.value)[0] == "dead_letter"


def test_analyzer_settings_load_with_every_need() -> None:
    from services.analyzer.needs import enabled
    from services.analyzer.settings import AnalyzerSettings

    settings = AnalyzerSettings()
    assert [m.name for m in enabled(settings.enabled_needs)] == [
        "offline", "restart_agent", "online", "load_balance", "scale"]
    assert settings.scale.high_enter == 80.0


@pytest.mark.parametrize(
    ("hour", "start", "end", "wanted"),
    [(12, 7, 21, 5.0), (6, 7, 21, 30.0), (21, 7, 21, 30.0), (23, 20, 6, 5.0), (7, 20, 6, 30.0)],
)
def test_day_and_night_report_intervals(hour: int, start: int, end: int, wanted: float) -> None:
    now = NOW.replace(hour=hour)
    assert collector.desired_interval(now, 5.0, 30.0, start, end) == wanted
    assert collector.desired_interval(now, None, 30.0, start, end) is None


def test_ranges_are_configurable_per_cluster_and_per_pool() -> None:
    from services.analyzer.settings import AnalyzerSettings

    settings = AnalyzerSettings(overrides={
        "prod": {"scale": {"high_enter": 90.0, "high_exit": 85.0}},
        "prod/inference": {"scale": {"hold_s": 5.0}},
    })
    default = settings.args_for("scale", "lab", "default")
    prod = settings.args_for("scale", "prod", "training")
    inference = settings.args_for("scale", "prod", "inference")
    assert (default.high_enter, default.hold_s) == (80.0, 60.0)  # type: ignore[attr-defined]
    assert (prod.high_enter, prod.hold_s) == (90.0, 60.0)  # type: ignore[attr-defined]
    assert (inference.high_enter, inference.hold_s) == (90.0, 5.0)  # type: ignore[attr-defined]


def test_a_bad_override_is_refused_at_start() -> None:
    from pydantic import ValidationError

    from services.analyzer.settings import AnalyzerSettings

    with pytest.raises(ValidationError, match="unknown need"):
        AnalyzerSettings(overrides={"prod": {"teleport": {"x": 1}}})
    with pytest.raises(ValidationError, match="high_enter"):
        AnalyzerSettings(overrides={"prod": {"scale": {"high_enter": 10.0}}})


def test_an_error_raised_from_an_outage_waits_and_one_raised_from_a_bug_does_not() -> None:
    from services.scheduler.safety_store import SafetyUnreadable

    outage = SafetyUnreadable("pool health unreadable")
    outage.__cause__ = RedisConnectionError("refused")
    assert classify(outage)[:2] == ("wait", "infrastructure_unavailable")
    corrupt = SafetyUnreadable("pool health unreadable")
    corrupt.__cause__ = ValueError("corrupt hash")
    assert classify(corrupt)[:2] == ("dead_letter", "unhandled_error")


def test_a_sample_keeps_the_host_load() -> None:
    report = example("node_report", NodeReport)
    host = report.host.model_copy(update={"memory_used_mib": report.host.memory_total_mib // 4,
                                          "net_rx_bytes_per_s": 10.0,
                                          "net_tx_bytes_per_s": 5.0})
    sample = collector.summarize(report.model_copy(update={"host": host}), "collector", NOW)
    assert (sample.cpu_pct, sample.disk_used_pct) == (host.cpu_pct, host.disk_used_pct)
    assert sample.memory_pct == pytest.approx(25.0, abs=0.01)
    assert sample.net_bytes_per_s == 15.0
    assert Sample.model_validate_json(sample.model_dump_json()) == sample


def test_a_report_seq_ahead_of_the_clock_beyond_the_skew_is_implausible() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    now_ms = int(now.timestamp() * 1000)
    assert not collector.seq_ahead_of_clock(now_ms, now, 30.0)
    assert not collector.seq_ahead_of_clock(now_ms + 30_000, now, 30.0)  # within the skew
    assert collector.seq_ahead_of_clock(now_ms + 30_001, now, 30.0)
    assert collector.seq_ahead_of_clock(2**62, now, 30.0)
    assert not collector.seq_ahead_of_clock(7, now, 30.0)  # a counter from 0 is never ahead
