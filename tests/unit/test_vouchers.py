"""The executor's check of a dispatch against the scheduler's record (pure)."""

from __future__ import annotations

from uuid import uuid4

from schemas.events.v1 import DrainNode, OpsTask, Step, now_utc
from services.shared.vouchers import digest, judge


def task() -> OpsTask:
    task_id = uuid4()
    return OpsTask(event_id=uuid4(), source="test", occurred_at=now_utc(), cluster_id="c1",
                   subject=str(task_id), task_id=task_id, need_id=uuid4(), need_kind="offline",
                   template="offline", target="node-001", priority=1,
                   mutex_keys=["node.c1.node-001"],
                   steps=[Step(index=0, name="drain", action=DrainNode(node_id="node-001"))])


def test_only_the_recorded_task_with_an_epoch_the_scheduler_issued_is_acted_on() -> None:
    t = task()
    record = f"41:{digest(t)}"
    assert judge(record, t, 41).verdict == "genuine"
    assert judge(record, t, 40).verdict == "earlier"  # redelivered: the journal says stale
    assert judge(record, t, 42).verdict == "refused"
    assert judge(record, t, 2**63 - 1).verdict == "refused"
    assert judge(None, t, 41).verdict == "refused"
    assert judge(f"41:{digest(task())}", t, 41).verdict == "refused"
    assert judge("garbage", t, 41).verdict == "refused"


def test_the_digest_survives_the_trip_through_the_broker() -> None:
    t = task()
    assert digest(OpsTask.model_validate_json(t.model_dump_json())) == digest(t)
