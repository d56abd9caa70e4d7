"""The remediation bench's eviction rates: over all evictions, and once every drain is under
way (the budget then the only pace)."""

from __future__ import annotations

import pytest

from bench.kubernetes_remediation import Victim, eviction_rate, saturated_eviction_rate


def victim(node: str, cordoned_at: float | None, evicted: list[float]) -> Victim:
    return Victim(node=node, pods=[], cordoned_at=cordoned_at,
                  evicted_at={f"ns/{node}-{i}": t for i, t in enumerate(evicted)})


def test_the_rate_once_every_drain_is_under_way_leaves_out_the_idle_start() -> None:
    # The first node's pods go at 5/s from t=0; the second node is cordoned only at 2.0, so
    # the bucket idled from 0.6 to 2.0 for want of pods, then paced 5/s again.
    first = victim("a", 0.0, [0.0, 0.2, 0.4, 0.6])
    second = victim("b", 2.0, [2.0, 2.2, 2.4, 2.6, 2.8, 3.0])
    assert eviction_rate([first, second]) == pytest.approx(3.0)
    assert saturated_eviction_rate([first, second]) == pytest.approx(5.0)


def test_no_saturated_rate_until_every_faulted_node_was_cordoned() -> None:
    assert saturated_eviction_rate([victim("a", 0.0, [0.1, 0.3]),
                                    victim("b", None, [])]) is None
    assert saturated_eviction_rate([victim("a", 5.0, [1.0, 2.0])]) is None
