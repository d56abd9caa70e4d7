"""The registry's served arms: every model on every node (pure; the batches on the real Redis
are in tests/service/router/test_registry_batch.py)."""

from __future__ import annotations

from services.router.registry import NodeModels, served_arms
from tests.unit.router.helpers import served

MLP1, MLP2 = served("digits-mlp", "1", "mlp"), served("digits-mlp", "2", "mlp")


def test_served_arms_are_every_model_on_every_node() -> None:
    entries = [NodeModels(node="node-001", seq=1, at=0.0, interval_s=1.0, mode="active",
                          models=[MLP1, MLP2]),
               NodeModels(node="node-002", seq=1, at=0.0, interval_s=1.0, mode="draining",
                          models=[served("speech-x", "3", "x", state="loading")])]
    assert served_arms(entries) == [
        "arm:digits-mlp:1@node-001", "arm:digits-mlp:2@node-001", "arm:speech-x:3@node-002"]
