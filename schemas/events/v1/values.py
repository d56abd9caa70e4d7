"""Value types that more than one family of v1 events uses (bounds, modes, ML inputs)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.envelope import ShortText

Percent = Annotated[float, Field(ge=0.0, le=100.0)]
MiB = Annotated[int, Field(ge=0, le=4_194_304)]
Count = Annotated[int, Field(ge=0, le=2**53)]
Seq = Annotated[int, Field(ge=0, le=2**63 - 1)]
Priority = Annotated[int, Field(ge=0, le=9, description="0 is the most urgent.")]
StepIndex = Annotated[int, Field(ge=0, le=63)]

NodeMode = Literal["active", "draining", "offline"]
NeedKind = Literal["scale_out", "scale_in", "load_balance", "offline", "online"]
OutputValue = ShortText | int | float | bool

# ML task routing
ModelVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,32}$")]
Attempt = Annotated[int, Field(ge=1, le=16, description="1 for the first try of a task.")]
# A task's input: numbers only (the digits models take 64 pixel counts 0..16). Bounded so a
# signed command carrying it stays far below the agents' 16 KiB command limit.
MlInput = Annotated[list[Annotated[float, Field(ge=-1e6, le=1e6)]],
                    Field(min_length=1, max_length=1_024)]
# Why an ML attempt failed, in the words of the selector's attribution
# (services/router/policy/attribution.py):
# model_fault counts against the model, node_fault against the node, timeout and unknown
# against both; bad_input, capacity and deadline_too_short against neither. Two more never
# reach the statistics: unavailable (the model was not ready there, or the agent refused the
# command: the router's view was stale) and no_candidates (nothing served the task type).
InferenceCause = Literal["model_fault", "node_fault", "timeout", "unknown", "bad_input",
                         "capacity", "deadline_too_short", "unavailable", "no_candidates"]
