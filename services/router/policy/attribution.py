"""Outcome cause -> which statistics it counts against (docs/routing-policy.md §Attribution).

A node fault counts against the node (and the arm on it), a model fault against the model,
its family and the arm; a timeout or an unclassified failure against both (its weight split
between the model and the node by `services.router.policy.updates.record`, see
`SelectorConfig.split_ambiguous`). Bad input, a capacity rejection and a deadline too short
to meet count against nobody: they say nothing about the target (LiteLLM PR #40958 counted
its own "no deployments" errors and cooled healthy deployments down).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

Cause = Literal[
    "ok",
    "node_fault",          # worker lost, OOM, GPU/driver error, connection refused
    "model_fault",         # invalid/NaN output, exception in model code, load failure
    "timeout",             # no answer before the attempt's deadline
    "unknown",             # a failure nobody classified
    "bad_input",           # the task itself is invalid: fails anywhere
    "capacity",            # rejected: queue full, over the node's limit
    "deadline_too_short",  # refused because the deadline could not be met from the start
]
CAUSES: tuple[Cause, ...] = get_args(Cause)
# Failures that count against some target.
COUNTED: frozenset[Cause] = frozenset({"node_fault", "model_fault", "timeout", "unknown"})
# Outcomes that count against nobody.
NEUTRAL: frozenset[Cause] = frozenset({"bad_input", "capacity", "deadline_too_short"})


@dataclass(frozen=True, slots=True)
class Blame:
    """Which levels an outcome updates; `success` says whether it is a success there."""

    success: bool
    arm: bool
    model: bool
    family: bool
    node: bool

    @property
    def counted(self) -> bool:
        """Whether the outcome updates any statistic at all."""
        return self.arm or self.model or self.family or self.node


ATTRIBUTION: Mapping[Cause, Blame] = {
    "ok": Blame(success=True, arm=True, model=True, family=True, node=True),
    "node_fault": Blame(success=False, arm=True, model=False, family=False, node=True),
    "model_fault": Blame(success=False, arm=True, model=True, family=True, node=False),
    "timeout": Blame(success=False, arm=True, model=True, family=True, node=True),
    "unknown": Blame(success=False, arm=True, model=True, family=True, node=True),
    "bad_input": Blame(success=False, arm=False, model=False, family=False, node=False),
    "capacity": Blame(success=False, arm=False, model=False, family=False, node=False),
    "deadline_too_short": Blame(success=False, arm=False, model=False, family=False,
                                node=False),
}


def attribute(cause: Cause) -> Blame:
    """What `cause` counts against."""
    return ATTRIBUTION[cause]
