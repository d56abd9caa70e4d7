"""How a backend's answer ends a step (pure): refused is a permanent failure that says why, an
incomplete drain is a retryable one, and a completed drain's outputs keep the schedulable GPUs
before and after and where each replacement runs. A cluster's registered backend round-trips."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from schemas.events.v1 import Evidence, OfflineNode, OpsTask, Step, now_utc
from services.backends.base import (
    Checkpoint,
    DrainResult,
    Inventory,
    NodeGpus,
    NodeResult,
    Outcome,
    PodMove,
)
from services.executor.backend_steps import (
    schedulable_gpus,
    settle_drain,
    settle_node,
    step_ref,
    task_reason,
)
from services.executor.ports import Completed, Failed
from services.shared.registry import LOCAL, ClusterBackend

MOVE = PodMove(namespace="ml", pod="train-0", from_node="gpu-1", replacement="train-0",
               to_node="gpu-2", pdb_waits=3)


def test_an_applied_or_repeated_node_operation_completes_and_says_which() -> None:
    done = settle_node(NodeResult("gpu-1", Outcome.APPLIED), "offline")
    again = settle_node(NodeResult("gpu-1", Outcome.ALREADY, "already offline"), "offline")
    dry = settle_node(NodeResult("gpu-1", Outcome.DRY_RUN), "offline")
    assert isinstance(done, Completed)
    assert done.outputs["outcome"] == "applied"
    assert isinstance(again, Completed)
    assert again.outputs["detail"] == "already offline"
    assert isinstance(dry, Completed)
    assert dry.outputs["dry_run"] is True


def test_a_refusal_by_the_one_owner_rule_fails_the_step_for_good_with_the_reason() -> None:
    result = settle_node(NodeResult("gpu-1", Outcome.REFUSED, "cordoned by someone else"),
                         "online_node")
    assert isinstance(result, Failed)
    assert result.permanent
    assert result.reason.startswith("refused: online_node of gpu-1")
    assert "cordoned by someone else" in result.reason
    drain = settle_drain(DrainResult("gpu-1", refused="cordoned by someone else"), 16, 16)
    assert isinstance(drain, Failed)
    assert drain.permanent
    assert "refused" in drain.reason


def test_a_complete_drain_records_the_gpus_before_and_after_and_where_pods_went() -> None:
    result = settle_drain(DrainResult("gpu-1", moved=(MOVE,)), gpus_before=24, gpus_after=16)
    assert isinstance(result, Completed)
    assert result.outputs["evicted"] == 1
    assert result.outputs["moves"] == "ml/train-0->gpu-2"
    assert result.outputs["replacements_on"] == "gpu-2"
    assert result.outputs["pdb_waits"] == 3
    assert (result.outputs["gpus_schedulable_before"],
            result.outputs["gpus_schedulable_after"]) == (24, 16)


def test_a_drain_still_held_or_unplaced_when_its_time_ran_out_is_tried_again() -> None:
    held = settle_drain(DrainResult("gpu-1", moved=(MOVE,), held=("ml/train-1",)), 24, 16)
    unplaced = settle_drain(DrainResult("gpu-1", unplaced=("ml/train-2",)), 24, 16)
    for result, words in ((held, "PodDisruptionBudget: ml/train-1"),
                          (unplaced, "without a replacement Running elsewhere: ml/train-2")):
        assert isinstance(result, Failed)
        assert not result.permanent
        assert result.reason.startswith("drain_incomplete: gpu-1")
        assert words in result.reason


def test_schedulable_gpus_count_only_schedulable_ready_nodes() -> None:
    inventory = Inventory(nodes=(
        NodeGpus("a", 8, 8, schedulable=True, ready=True),
        NodeGpus("b", 8, 8, schedulable=False, ready=True),
        NodeGpus("c", 8, 6, schedulable=True, ready=False),
        NodeGpus("d", 8, 7, schedulable=True, ready=True),
    ), pods_by_node={}, pending=())
    assert schedulable_gpus(inventory) == 15


def test_writes_name_the_task_and_step_and_the_reason_comes_from_the_evidence() -> None:
    task_id = uuid4()
    task = OpsTask(
        event_id=uuid4(), source="test", occurred_at=now_utc(), cluster_id="k1",
        subject="gpu-1", task_id=task_id, need_id=uuid4(), need_kind="offline",
        template="offline", target="gpu-1", priority=1, mutex_keys=["node.k1.gpu-1"],
        steps=[Step(index=0, name="offline", action=OfflineNode(node_id="gpu-1"))],
        evidence=[Evidence(metric="xid", value=79, range_low=0, range_high=0,
                           observed_at=datetime.now(UTC), detail="xid 79")],
    )
    assert step_ref(task, 0).task_id == str(task_id)
    assert step_ref(task, 0).step == "0:offline"
    assert task_reason(task) == "offline xid 79"
    assert task_reason(task.model_copy(update={"evidence": []})) == "offline"


def test_a_cluster_backend_round_trips_and_refuses_what_it_cannot_be() -> None:
    kube = ClusterBackend(kind="kubernetes", kubeconfig="/etc/k.conf", evictions_per_s=2.0,
                          eviction_burst=3)
    assert ClusterBackend.from_json(kube.to_json()) == kube
    assert LOCAL.kind == "local"
    with pytest.raises(ValueError, match="unknown backend"):
        ClusterBackend(kind="slurm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eviction budget"):
        ClusterBackend(kind="kubernetes", evictions_per_s=0.0)


def test_a_dry_run_drain_completes_saying_what_would_be_evicted_and_held() -> None:
    would = PodMove(namespace="ml", pod="train-0", from_node="gpu-1")
    result = settle_drain(DrainResult("gpu-1", moved=(would,), held=("ml/train-1",),
                                      unplaced=("ml/train-0",), dry_run=True), 24, 24)
    assert isinstance(result, Completed)
    assert result.outputs["dry_run"] is True
    assert (result.outputs["would_evict"], result.outputs["held"]) == (1, 1)


def test_a_drain_records_from_which_checkpoint_step_each_workload_goes_on() -> None:
    acked = PodMove(namespace="ml", pod="train-0", from_node="gpu-1", replacement="train-0",
                    to_node="gpu-2", checkpoint=Checkpoint.ACKED, checkpoint_step=1200,
                    resumed_from=1200)
    silent = PodMove(namespace="ml", pod="train-1", from_node="gpu-1", replacement="train-1",
                     to_node="gpu-3", checkpoint=Checkpoint.TIMED_OUT)
    result = settle_drain(DrainResult("gpu-1", moved=(acked, silent, MOVE)), 24, 16)
    assert isinstance(result, Completed)
    assert result.outputs["checkpoints_acked"] == 1
    assert result.outputs["checkpoints_timed_out"] == 1
    # A pod that does not speak the protocol (MOVE) is not listed: it was never asked.
    assert result.outputs["checkpoints"] == "ml/train-0@1200>resumed@1200,ml/train-1@timed_out"
    # A drain of pods none of which opted in says nothing of checkpoints.
    plain = settle_drain(DrainResult("gpu-1", moved=(MOVE,)), 24, 16)
    assert isinstance(plain, Completed)
    assert "checkpoints" not in plain.outputs
