"""The tuner's measures on the real redis-server: a decayed throughput per node per pool and
node type, only from working nodes, read back for the policy."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from schemas.events.v1 import Sample
from services.shared.redis_client import Keys
from services.tuner.measures import Measures
from tests.contracts.examples import example


def sample(pool: str, node_type: str, throughput: float, *, mode: str = "active",
           faults: int = 0) -> Sample:
    golden = example("sample", Sample)
    return golden.model_copy(update={"pool": pool, "node_type": node_type, "mode": mode,
                                     "job_throughput": throughput, "fault_count": faults,
                                     "gpu_count": 2})


async def test_samples_fold_into_a_decayed_measure_per_pool_and_node_type(
        redis: Redis, keys: Keys) -> None:
    measures = Measures(redis, keys, alpha=0.5, clock=lambda: 1000.0)
    counted = await measures.record([
        sample("p1", "A100", 100.0), sample("p1", "A100", 200.0), sample("p1", "H100", 300.0),
        sample("p2", "A100", 50.0),
        # Not what a node can deliver: idle, leaving service, faulty.
        sample("p1", "A100", 0.0), sample("p1", "A100", 900.0, mode="draining"),
        sample("p1", "A100", 900.0, faults=1),
    ])
    assert counted == 4
    found = {(m.pool, m.node_type): m for m in await measures.all()}
    assert set(found) == {("p1", "A100"), ("p1", "H100"), ("p2", "A100")}
    a100 = found[("p1", "A100")]
    assert (a100.throughput_per_node, a100.samples, a100.at) == (150.0, 2, 1000.0)
    assert a100.throughput_per_gpu == pytest.approx(75.0)
    assert found[("p1", "H100")].throughput_per_node == 300.0
    assert await measures.record([sample("p1", "A100", 0.0)]) == 0
