"""Change points recorded through the router rewrite every arm they concern, in Redis."""

from __future__ import annotations

from typing import Any

from services.router.policy.codec import decode_arm, decode_counts
from services.router.policy.config import SelectorConfig
from services.router.policy.stats import ArmState, Counts, arm_key, model_key
from services.shared.redis_client import text
from tests.service.router.conftest import CLUSTER, Harness
from tests.unit.router.helpers import served

MLP = "digits-mlp:1"


async def arm_state(h: Harness, model: str, node: str) -> ArmState:
    raw = await h.redis.hgetall(h.keys.ml_stats(CLUSTER, arm_key(model, node)))
    return decode_arm({text(k): v for k, v in raw.items()})


async def model_level(h: Harness, model: str) -> Counts:
    raw = await h.redis.hgetall(h.keys.ml_stats(CLUSTER, model_key(model)))
    return decode_counts({text(k): v for k, v in raw.items()})


async def run_one(h: Harness, cause: str | None) -> str:
    """One task, answered with `cause` (None: success); the node its attempt ran on."""
    task = await h.submit()
    [command] = h.commands(task.task_id)
    h.clock.advance(0.01)
    await h.answer(command, cause)  # type: ignore[arg-type]
    assert h.outcomes(task.task_id)[-1].final
    return command.node_id


async def test_a_model_change_point_discounts_the_other_arms_of_that_model(
        make_harness: Any) -> None:
    # One attempt per task, no quarantine: every outcome lands where the test wants it.
    h: Harness = make_harness(policy=SelectorConfig(quarantine=False, max_retries=0))
    mlp = [served("digits-mlp", "1", "mlp")]
    # A healthy history on node-002's arm of the model...
    await h.report("node-002", mlp)
    for _ in range(15):
        assert await run_one(h, None) == "node-002"
    # ...then node-002 drains (it keeps its history) and node-001 serves the model, long
    # enough later that the model's fast window has forgotten the successes.
    h.clock.advance(120.0)
    await h.report("node-002", mlp, mode="draining")
    await h.report("node-001", mlp)
    sibling_before = await arm_state(h, MLP, "node-002")
    level_before = await model_level(h, MLP)
    assert sibling_before.counts.ok > 14.0
    assert level_before.ok > 14.0

    # The model starts failing on node-001: a model-level change point, recorded by the
    # router's conclusion of one of these outcomes.
    for _ in range(6):
        assert await run_one(h, "model_fault") == "node-001"

    level_after = await model_level(h, MLP)
    assert level_after.ok < 1.0  # the model's long counts restarted from its fast window
    sibling = await arm_state(h, MLP, "node-002")
    # The sibling arm's history was discounted (change_forget 0.1) although no outcome of
    # this phase ran on it: its counts shrank in Redis, its own state is untouched.
    assert sibling.counts.ok < 0.2 * sibling_before.counts.ok
    assert sibling.counts.updated > sibling_before.counts.updated
    assert (sibling.inflight, sibling.consecutive, sibling.quarantined) == (
        sibling_before.inflight, sibling_before.consecutive, sibling_before.quarantined)
    # The arm the outcomes ran on was counted as before.
    assert (await arm_state(h, MLP, "node-001")).counts.model_fault > 0.0
