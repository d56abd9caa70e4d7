"""Table tests of GPU fault classification: the XID table, ECC, node faults, escalation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from schemas.events.v1 import ActionClass, Fault, FaultKind, GpuMetrics
from services.analyzer.faults import (
    PUBLISHED_XID_ACTIONS,
    FaultArgs,
    classify,
    count_within,
    escalate,
    strongest,
    xid_action,
)
from tests.unit.analyzer.timeline import T0, gpu

ARGS = FaultArgs()


def xid(code: int, gpu_index: int | None = 0) -> Fault:
    return Fault(kind="xid", code=code, gpu_index=gpu_index)


@pytest.mark.parametrize(
    ("code", "action"),
    [
        # Replace: the published table's hardware failures.
        (74, "replace"), (79, "replace"), (119, "replace"), (120, "replace"), (121, "replace"),
        (140, "replace"),
        # Reboot: ECC and memory-remapping faults the table clears with a reboot.
        (48, "reboot"), (63, "reboot"), (64, "reboot"), (94, "reboot"), (95, "reboot"),
        # Application faults: recorded, never acted on by themselves.
        (13, "none"), (31, "none"), (43, "none"), (45, "none"),
        # Unknown XIDs are events only.
        (8, "none"), (999, "none"), (0, "none"),
    ],
)
def test_xid_table(code: int, action: ActionClass) -> None:
    assert xid_action(code, ARGS) == action
    verdict = classify([xid(code)], [], ARGS)
    assert verdict.action_class == action
    assert bool(verdict.counted) is (action != "none")
    assert bool(verdict.ignored) is (action == "none")


def test_only_application_xids_depart_from_the_published_table() -> None:
    changed = {code for code, action in PUBLISHED_XID_ACTIONS.items()
               if xid_action(code, ARGS) != action}
    assert changed == {13, 31}


@pytest.mark.parametrize(
    ("overrides", "code", "action"),
    [({13: "reboot"}, 13, "reboot"), ({79: "reset"}, 79, "reset"), ({999: "drain"}, 999, "drain"),
     ({48: "none"}, 48, "none")],
)
def test_xid_overrides(overrides: dict[int, ActionClass], code: int, action: ActionClass) -> None:
    assert classify([xid(code)], [], FaultArgs(xid_overrides=overrides)).action_class == action


def test_an_xid_without_a_code_is_recorded_only() -> None:
    verdict = classify([Fault(kind="xid")], [], ARGS)
    assert (verdict.action_class, verdict.counted) == ("none", ())


@pytest.mark.parametrize("kind", ["heartbeat_missed", "probe_failed", "agent", "hung_job"])
def test_node_faults_drain(kind: FaultKind) -> None:
    verdict = classify([Fault(kind=kind)], [], ARGS)
    assert verdict.action_class == "drain"
    assert not verdict.gpu_only


@pytest.mark.parametrize(
    ("faults", "action"),
    [
        ([xid(13), xid(48)], "reboot"),
        ([xid(79, 1), xid(48, 2)], "replace"),
        ([Fault(kind="hung_job"), xid(94)], "reboot"),
        ([Fault(kind="hung_job"), xid(13)], "drain"),
        ([], "none"),
    ],
)
def test_the_strongest_class_wins(faults: list[Fault], action: ActionClass) -> None:
    assert classify(faults, [], ARGS).action_class == action


@pytest.mark.parametrize(
    ("gpus", "action", "counted"),
    [
        pytest.param([gpu(0)], "none", 0, id="healthy"),
        pytest.param([gpu(0, ecc_uncorrected_volatile=2)], "reboot", 1,
                     id="uncorrected volatile ECC: reboot at least"),
        pytest.param([gpu(0, ecc_uncorrected_aggregate=9)], "none", 0,
                     id="aggregate errors from before the last reboot do not count"),
        pytest.param([gpu(0, ecc_corrected_volatile=10_000)], "none", 0,
                     id="corrected ECC is ignored without a limit"),
        pytest.param([gpu(0, xid_events=[79, 79])], "replace", 1,
                     id="XIDs from the metrics, each code once"),
        pytest.param([gpu(0, xid_events=[79]), gpu(1, ecc_uncorrected_volatile=1)], "replace", 2,
                     id="two GPUs, two faults"),
    ],
)
def test_gpu_metrics(gpus: list[GpuMetrics], action: ActionClass, counted: int) -> None:
    verdict = classify([], gpus, ARGS)
    assert (verdict.action_class, len(verdict.counted)) == (action, counted)


@pytest.mark.parametrize(
    ("corrected", "limit", "action"),
    [(10, 10, "none"), (11, 10, "drain"), (0, 0, "none"), (1, 0, "drain")],
)
def test_corrected_ecc_above_its_limit_drains(corrected: int, limit: int,
                                              action: ActionClass) -> None:
    args = FaultArgs(ecc_corrected_max=limit)
    assert classify([], [gpu(0, ecc_corrected_volatile=corrected)], args).action_class == action


def test_ecc_fault_reported_by_the_agent_reboots() -> None:
    fault = Fault(kind="ecc", gpu_index=3, detail="2 uncorrected ECC errors (volatile)")
    verdict = classify([fault], [], ARGS)
    assert verdict.action_class == "reboot"
    assert verdict.gpu_only


def test_a_fault_in_the_list_and_the_metrics_counts_once() -> None:
    # The agent copies a GPU's XIDs and uncorrected ECC into its fault list.
    faults = [xid(79, 0), Fault(kind="ecc", gpu_index=0, detail="1 uncorrected")]
    gpus = [gpu(0, xid_events=[79], ecc_uncorrected_volatile=1)]
    assert len(classify(faults, gpus, ARGS).counted) == 2


@pytest.mark.parametrize(
    ("action", "count", "threshold", "escalated"),
    [
        ("reboot", 5, 5, "replace"),
        ("reboot", 4, 5, "reboot"),
        ("reset", 6, 5, "replace"),
        ("replace", 9, 5, "replace"),
        ("drain", 9, 5, "drain"),  # a node fault is not a failing GPU
        ("none", 9, 5, "none"),  # an application XID is not either
    ],
)
def test_escalate(action: ActionClass, count: int, threshold: int,
                  escalated: ActionClass) -> None:
    assert escalate(action, count, threshold) == escalated


@pytest.mark.parametrize(
    ("faults", "recent", "action", "escalated_gpus"),
    [
        pytest.param([xid(48, 2)], {2: 4}, "replace", (2,), id="the fifth fatal fault in 24 h"),
        pytest.param([xid(48, 2)], {2: 3}, "reboot", (), id="the fourth is not enough"),
        pytest.param([xid(48, 2)], {1: 10}, "reboot", (), id="another GPU's history"),
        pytest.param([xid(48, 2), xid(94, 2)], {2: 3}, "replace", (2,),
                     id="faults in this report count too"),
        pytest.param([xid(13, 2)], {2: 10}, "none", (), id="application XIDs never escalate"),
        pytest.param([Fault(kind="hung_job")], {0: 10}, "drain", (), id="node faults neither"),
    ],
)
def test_repeated_faults_escalate_to_replace(
    faults: list[Fault], recent: dict[int, int], action: ActionClass,
    escalated_gpus: tuple[int, ...],
) -> None:
    verdict = classify(faults, [], ARGS, recent)
    assert verdict.action_class == action
    assert verdict.escalated_gpus == escalated_gpus
    if escalated_gpus:
        assert "reboot->replace" in verdict.detail
        assert "fatal faults within 86400s (limit 5)" in verdict.detail


def test_the_repeat_threshold_is_an_argument() -> None:
    verdict = classify([xid(48, 2)], [], FaultArgs(repeat_threshold=2), {2: 1})
    assert verdict.action_class == "replace"


def test_fatal_faults_per_gpu_are_what_a_history_records() -> None:
    faults = [xid(48, 0), xid(79, 0), xid(13, 1), Fault(kind="hung_job"), xid(94, 3)]
    assert classify(faults, [], ARGS).fatal_by_gpu == {0: 2, 3: 1}


def test_count_within_a_window() -> None:
    times = [T0 - timedelta(hours=h) for h in (0, 1, 23, 24, 25)] + [T0 + timedelta(seconds=1)]
    assert count_within(times, T0, 86_400.0) == 4


def test_detail_names_each_fault_and_its_class() -> None:
    detail = classify([xid(79, 1), xid(13, 2), Fault(kind="hung_job", detail="job-7")],
                      [gpu(0, ecc_uncorrected_volatile=2)], ARGS).detail
    assert "xid 79 on gpu 1: replace" in detail
    assert "hung_job [job-7]: drain" in detail
    assert "ecc on gpu 0 [2 uncorrected ECC errors (volatile)]: reboot" in detail
    assert "recorded only: xid 13 on gpu 2" in detail


def test_strongest_of_nothing_is_none() -> None:
    assert strongest([]) == "none"
    assert strongest(["drain", "reset", "reboot"]) == "reboot"


@pytest.mark.parametrize(
    "fields",
    [{"repeat_threshold": 0}, {"repeat_window_s": 0.0}, {"ecc_corrected_max": -1},
     {"xid_overrides": {13: "explode"}}, {"xid_overrides": {70_000: "reboot"}},
     {"colour": "red"}],
)
def test_fault_args_are_validated(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        FaultArgs.model_validate(fields)


def test_default_fault_args() -> None:
    assert FaultArgs().model_dump() == {
        "xid_overrides": {}, "ecc_corrected_max": None, "repeat_threshold": 5,
        "repeat_window_s": 86_400.0,
    }
