"""The local capacity provider's standby nodes, as its settings list them (pure; the provider
itself, with real agent processes, is in tests/service/capacity/test_local.py)."""

from __future__ import annotations

import pytest

from services.capacity.settings import CapacitySettings


def test_standby_nodes_from_a_list_or_a_count() -> None:
    listed = CapacitySettings(local_standby="standby-1:4, standby-2:8,spare")
    assert listed.standby_nodes() == [("standby-1", 4), ("standby-2", 8), ("spare", 2)]
    counted = CapacitySettings(local_standby="3", local_gpus=4)
    assert counted.standby_nodes() == [("standby-1", 4), ("standby-2", 4), ("standby-3", 4)]
    assert CapacitySettings().standby_nodes() == []


@pytest.mark.parametrize("spec", ["bad name:4", "a:x", "a:0", "a:65", "a:1,a:2"])
def test_bad_standby_lists_fail_at_start(spec: str) -> None:
    with pytest.raises(ValueError, match="local_standby"):
        CapacitySettings(local_standby=spec)
