"""The envelope every event carries, and the strict base configuration."""

from datetime import datetime
from typing import Annotated, Any, ClassVar, Final, Literal, Self
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_serializer,
)
from pydantic.config import ExtraValues
from pydantic_core import from_json

SCHEMA_VERSION: Final = 1
# The field naming the minor version of a document's schema (see `Versioned`).
MINOR_FIELD: Final = "schema_minor"

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


SchemaMinor = Annotated[int, Field(
    ge=0, le=65_535,
    description="The minor version of the schema its writer used, left out at 0: a reader "
    "that knows an older minor ignores the fields it does not know. Left out, it reads as "
    "the reader's own (the message has no field the reader lacks).")]


def written_at_minor(minor: int) -> Any:
    """The `schema_minor` field of a model whose schema is at `minor`: its default, so an
    event built here says so, and written only above 0, so that a document of minor 0 is
    the same bytes as before the field existed (readers older than it refuse it)."""
    return Field(default=minor, exclude=minor == 0)


class Versioned(Strict):
    """A document that says which minor version of its schema its producer wrote.

    Within a major version a schema changes only by new optional fields, and each such
    change raises the minor of the topic's model: `schema_minor: SchemaMinor =
    written_at_minor(n)`, which `SCHEMA_MINOR` then reads. A message whose `schema_minor` is
    above the reader's may carry fields the reader does not know: those are ignored, at
    every depth, and every known field is still validated strictly. A message of the
    reader's minor or older that carries an unknown field is refused as before, since no
    producer of that minor writes one: it is a typo or a forgery.
    """

    SCHEMA_MINOR: ClassVar[int] = 0
    """The minor this process knows: the default of the class's `schema_minor` field."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get(MINOR_FIELD)
        if field is None or type(field.default) is not int:
            raise TypeError(f"{cls.__name__} needs `{MINOR_FIELD}: SchemaMinor = "
                            "written_at_minor(n)`")
        cls.SCHEMA_MINOR = field.default

    @field_serializer(MINOR_FIELD, check_fields=False)
    def _stamp_minor(self, declared: int) -> int:
        # A dump holds exactly this class's fields, so it is of this class's minor, whatever
        # a parsed document declared. Never called at minor 0: the field is left out there.
        return self.SCHEMA_MINOR

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, *,
                            strict: bool | None = None, extra: ExtraValues | None = None,
                            context: Any | None = None, by_alias: bool | None = None,
                            by_name: bool | None = None) -> Self:
        """Validate strictly; a newer minor's unknown fields are ignored (see the class)."""
        options: dict[str, Any] = {"strict": strict, "context": context, "by_alias": by_alias,
                                   "by_name": by_name}
        try:
            return super().model_validate_json(json_data, extra=extra, **options)
        except ValidationError as refusal:
            # The fast path is the strict one: only a refused document is read a second time.
            if extra is not None or not cls._newer_with_unknown_fields(refusal, json_data):
                raise
        return super().model_validate_json(json_data, extra="ignore", **options)

    @classmethod
    def model_validate(cls, obj: Any, *, strict: bool | None = None,
                       extra: ExtraValues | None = None, from_attributes: bool | None = None,
                       context: Any | None = None, by_alias: bool | None = None,
                       by_name: bool | None = None) -> Self:
        """Validate strictly; a newer minor's unknown fields are ignored (see the class)."""
        options: dict[str, Any] = {"strict": strict, "from_attributes": from_attributes,
                                   "context": context, "by_alias": by_alias, "by_name": by_name}
        try:
            return super().model_validate(obj, extra=extra, **options)
        except ValidationError as refusal:
            if extra is not None or not cls._newer_with_unknown_fields(refusal, obj):
                raise
        return super().model_validate(obj, extra="ignore", **options)

    @classmethod
    def _newer_with_unknown_fields(cls, refusal: ValidationError, document: Any) -> bool:
        """True when `refusal` names an unknown field and `document` declares a newer minor
        than this class knows (an exact integer, as the field itself requires)."""
        if not any(error["type"] == "extra_forbidden" for error in refusal.errors()):
            return False
        if isinstance(document, str | bytes | bytearray):
            try:
                document = from_json(document)
            except ValueError:
                return False
        minor = document.get(MINOR_FIELD) if isinstance(document, dict) else None
        return type(minor) is int and minor > cls.SCHEMA_MINOR


def exactly_an_int(value: object) -> object:
    """A Literal is checked by equality even in strict mode, so `true` and `1.0` would pass
    for 1: only the integer itself is version 1."""
    if type(value) is not int:
        raise ValueError("schema_version must be an integer")
    return value


class Envelope(Versioned):
    """Fields common to every event. `event_id` is the dedupe key of every consumer.

    `schema_version` is the major version (the `.v1` of the topic); `schema_minor` the
    additive changes within it that the producer knew (`Versioned`).
    """

    event_id: UUID
    event_type: str
    schema_version: Annotated[Literal[1], BeforeValidator(exactly_an_int)] = SCHEMA_VERSION
    schema_minor: SchemaMinor = written_at_minor(0)
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
