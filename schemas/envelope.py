"""The envelope every event carries, and the strict base configuration."""

from datetime import datetime
from typing import Annotated, Final, Literal
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

SCHEMA_VERSION: Final = 1

# Strict: unknown fields, NaN/inf and type coercions ("50" -> 50.0) are all rejected.
# The pydantic defaults accept every one of them.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, frozen=True)

# The longest identifier, short text and reason the contract accepts. Text made from
# unbounded input (an error, a joined list) is cut to fit with `short_text` or `reason_text`.
IDENTIFIER_MAX: Final = 128
SHORT_TEXT_MAX: Final = 256
REASON_MAX: Final = 500

Identifier = Annotated[str, StringConstraints(pattern=rf"^[A-Za-z0-9_.-]{{1,{IDENTIFIER_MAX}}}$")]
# A cluster's id: an identifier without dots. Lock names put it between dots
# (`node.<cluster>.<node>`), so a dotted cluster could make another cluster's lock name
# (`a.b` + `c` and `a` + `b.c`); without dots, two clusters never share one.
CLUSTER_ID_PATTERN: Final = rf"^[A-Za-z0-9_-]{{1,{IDENTIFIER_MAX}}}$"
ClusterId = Annotated[str, StringConstraints(pattern=CLUSTER_ID_PATTERN)]
ShortText = Annotated[str, StringConstraints(max_length=SHORT_TEXT_MAX)]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=REASON_MAX)]


def short_text(text: str) -> str:
    """`text` cut to fit a ShortText field or a text output value (its first 256 characters)."""
    return text[:SHORT_TEXT_MAX]


def reason_text(text: str) -> str:
    """`text` cut to fit a Reason (its first 500 characters)."""
    return text[:REASON_MAX]


class Strict(BaseModel):
    """Base of every value object in the contract."""

    model_config = STRICT


def exactly_an_int(value: object) -> object:
    """A Literal is checked by equality even in strict mode, so `true` and `1.0` would pass
    for 1: only the integer itself is version 1."""
    if type(value) is not int:
        raise ValueError("schema_version must be an integer")
    return value


class Envelope(Strict):
    """Fields common to every event. `event_id` is the dedupe key of every consumer."""

    event_id: UUID
    event_type: str
    schema_version: Annotated[Literal[1], BeforeValidator(exactly_an_int)] = SCHEMA_VERSION
    source: Identifier = Field(description="The service or agent that emitted the event.")
    occurred_at: AwareDatetime
    cluster_id: ClusterId
    subject: Identifier = Field(description="The node or task the event is about.")
    correlation_id: Identifier | None = Field(
        default=None, description="Ties an event to the one that caused it (e.g. need -> task)."
    )


def utc_iso(moment: datetime) -> str:
    """An aware datetime as the ISO text used in golden fixtures."""
    return moment.isoformat()
