"""Request bodies shared by the mutating routes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

# The contract's Reason (1-500 characters), and not only blanks: every mutating call says why.
Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]


class ReasonBody(BaseModel):
    """A body that says why (kept with the event it causes and in the audit log)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason
