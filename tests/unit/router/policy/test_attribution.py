"""The attribution table: what each outcome cause counts against."""

from __future__ import annotations

import pytest

from services.router.policy.attribution import CAUSES, COUNTED, NEUTRAL, Cause, attribute


@pytest.mark.parametrize(
    ("cause", "arm", "model", "family", "node"),
    [
        ("ok", True, True, True, True),
        ("node_fault", True, False, False, True),
        ("model_fault", True, True, True, False),
        ("timeout", True, True, True, True),
        ("unknown", True, True, True, True),
        ("bad_input", False, False, False, False),
        ("capacity", False, False, False, False),
        ("deadline_too_short", False, False, False, False),
    ],
)
def test_attribution_table(cause: Cause, arm: bool, model: bool, family: bool,
                           node: bool) -> None:
    blame = attribute(cause)
    assert (blame.arm, blame.model, blame.family, blame.node) == (arm, model, family, node)
    assert blame.success == (cause == "ok")


def test_every_cause_is_counted_or_neutral_or_success() -> None:
    assert set(CAUSES) == COUNTED | NEUTRAL | {"ok"}
    assert not COUNTED & NEUTRAL
    assert all(not attribute(c).counted for c in NEUTRAL)
