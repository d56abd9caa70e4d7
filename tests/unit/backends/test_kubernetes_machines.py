"""Cluster API Machines, the pure choices: which new machines a scale-up records (and so
enrols), and which machines a scale-down marks for deletion first."""

from __future__ import annotations

import json
from typing import Any

from schemas.kubernetes import CAPACITY_ANNOTATION, DELETE_MACHINE_ANNOTATION
from services.backends.base import StepRef
from services.backends.kubernetes.capacity import CapacityRecord
from services.backends.kubernetes.machines import (
    MachineView,
    arrivals,
    choose_removals,
    mark_of,
    mark_patch,
    record_patch,
)

STEP = StepRef(task_id="task-1", step="0:add-capacity")
OTHER = StepRef(task_id="task-0", step="0:add-capacity")


def machine(name: str, *, node: str | None = None, created: str = "2026-12-01T00:00:00Z",
            record: StepRef | None = None, mark: str | None = None,
            deleting: bool = False) -> MachineView:
    annotations: dict[str, str] = {}
    if record is not None:
        annotations[CAPACITY_ANNOTATION] = CapacityRecord(
            task_id=record.task_id, step=record.step, pool="gpu").to_json()
    if mark is not None:
        annotations[DELETE_MACHINE_ANNOTATION] = mark
    obj: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": "5",
                                        "creationTimestamp": created,
                                        "annotations": annotations},
                           "status": {"nodeRef": {"name": node}} if node else {}}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T01:00:00Z"
    return MachineView.of(obj)


def test_a_machine_view_reads_its_node_record_and_mark() -> None:
    view = machine("m-1", node="n-1", record=STEP, mark="x")
    assert (view.name, view.node, view.mark) == ("m-1", "n-1", "x")
    assert view.record is not None
    assert view.record.by(STEP)
    assert machine("m-2").node is None


def test_only_new_machines_whose_node_joined_are_recorded_up_to_the_growth() -> None:
    old = machine("old", node="n-old")
    joined = machine("new-1", node="n-1", created="2026-12-01T00:00:02Z")
    also = machine("new-2", node="n-2", created="2026-12-01T00:00:01Z")
    making = machine("new-3", created="2026-12-01T00:00:03Z")
    found = arrivals([old, joined, also, making], STEP, {"old"}, {"n-old", "n-1"}, wanted=2)
    # new-2's Node has not joined the cluster yet (not in the cache): it waits with new-3.
    assert [m.name for m in found.to_record] == ["new-1"]
    assert found.mine == ()
    assert found.waiting == ("new-3",)


def test_a_resend_counts_its_own_machines_and_records_no_more() -> None:
    mine = machine("new-1", node="n-1", record=STEP)
    extra = machine("new-2", node="n-2", created="2026-12-01T00:00:09Z")
    found = arrivals([mine, extra], STEP, set(), {"n-1", "n-2"}, wanted=1)
    assert [m.name for m in found.mine] == ["new-1"]
    assert (found.to_record, found.waiting) == ((), ())


def test_machines_someone_recorded_marked_or_deletes_are_never_counted_as_new() -> None:
    listed = [machine("theirs", node="a", record=OTHER), machine("going", node="b", mark="x"),
              machine("deleted", node="c", deleting=True)]
    found = arrivals(listed, STEP, set(), {"a", "b", "c"}, wanted=3)
    assert (found.mine, found.to_record, found.waiting) == ((), (), ())


def test_the_record_names_the_step_and_is_guarded_by_the_resource_version() -> None:
    patch = record_patch(machine("m"), STEP, "gpu")
    assert patch["metadata"]["resourceVersion"] == "5"
    record = json.loads(patch["metadata"]["annotations"][CAPACITY_ANNOTATION])
    assert record == {"task_id": "task-1", "step": "0:add-capacity", "pool": "gpu",
                      "state": "added"}


def test_idle_machines_go_first_then_those_clusterwarden_added_then_the_least_busy() -> None:
    busy = machine("busy", node="n-busy")
    light = machine("light", node="n-light")
    ours_busy = machine("ours-busy", node="n-ours-busy", record=OTHER)
    idle = machine("idle", node="n-idle")
    ours_idle = machine("ours-idle", node="n-ours-idle", record=OTHER)
    pods = {"n-busy": 3, "n-light": 1, "n-ours-busy": 3}
    listed = [busy, light, ours_busy, idle, ours_idle]
    assert choose_removals(listed, STEP, 4, (), pods) == ("ours-idle", "idle", "ours-busy",
                                                          "light")
    # nodes 0: every idle machine.
    assert choose_removals(listed, STEP, 0, (), pods) == ("ours-idle", "idle")
    # None idle: still one (the need says the pool runs below its range), the least busy.
    assert choose_removals([busy, light], STEP, 0, (), pods) == ("light",)
    # Named nodes: only their machines.
    assert choose_removals(listed, STEP, 0, ("n-busy",), pods) == ("busy",)


def test_among_equals_the_newest_machine_goes_first() -> None:
    older = machine("a", node="n-a", created="2026-12-01T00:00:00Z")
    newer = machine("b", node="n-b", created="2026-12-01T00:05:00Z")
    assert choose_removals([older, newer], STEP, 1, (), {}) == ("b",)


def test_a_resend_keeps_its_marks_and_marks_no_more() -> None:
    marked = machine("m-1", node="n-1", mark=mark_of(STEP))
    idle = machine("m-2", node="n-2")
    assert choose_removals([marked, idle], STEP, 1, (), {}) == ("m-1",)
    assert choose_removals([marked, idle], STEP, 0, (), {}) == ("m-1",)
    assert mark_patch(marked, STEP) is None


def test_machines_someone_else_marked_or_deletes_are_left_to_them() -> None:
    theirs = machine("theirs", node="n-1", mark="yes")
    deleting = machine("deleting", node="n-2", deleting=True)
    free = machine("free", node="n-3")
    assert choose_removals([theirs, deleting, free], STEP, 2, (), {}) == ("free",)
    assert mark_patch(theirs, STEP) is None
    assert mark_patch(deleting, STEP) is None
    patch = mark_patch(free, STEP)
    assert patch == {"metadata": {"resourceVersion": "5", "annotations": {
        DELETE_MACHINE_ANNOTATION: "task-1/0:add-capacity"}}}
