"""The need registry: order, levels, call shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.analyzer.needs import REGISTRY, NeedModule, enabled, offline, scale


def test_registry_order_levels_and_shapes() -> None:
    assert [(m.name, m.level, m.stateful) for m in REGISTRY] == [
        ("offline", "node", False),
        ("restart_agent", "node", False),
        ("online", "node", True),
        ("load_balance", "node", True),
        ("scale", "cluster", True),
    ]
    assert all(m.reason for m in REGISTRY)


def test_enabled_keeps_registry_order() -> None:
    assert [m.name for m in enabled(["scale", "offline"])] == ["offline", "scale"]
    with pytest.raises(ValueError, match="unknown needs"):
        enabled(["offline", "teleport"])


@pytest.mark.parametrize("module", REGISTRY, ids=lambda m: m.name)
def test_default_args_are_valid_frozen_and_closed(module: NeedModule) -> None:
    args = module.args()
    for field in list(module.args.model_fields)[:1]:  # a need may take no arguments
        with pytest.raises(ValidationError):
            setattr(args, field, 1)
    with pytest.raises(ValidationError):
        module.args.model_validate({"surprise": 1})


def test_a_module_has_exactly_one_entry_point() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        NeedModule("both", "node", offline.Args, "x", detect=offline.detect,
                   evaluate=scale.evaluate)
    with pytest.raises(ValueError, match="exactly one"):
        NeedModule("neither", "node", offline.Args, "x")
