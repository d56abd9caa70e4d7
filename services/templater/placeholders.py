"""Placeholders in template strings: `{target}`, `{cluster}`, `{pool}` and template parameters.

Only plain names are allowed: `str.format` would also accept `{target.__class__}`, `{0}`,
`{pool!r}` or `{pool:>8}`, none of which a template needs, and attribute access in a format
string written by an operator is a hazard.
"""

from __future__ import annotations

from collections.abc import Mapping
from string import Formatter

Scalar = str | int | float | bool
ArgValue = Scalar | None
Arg = ArgValue | dict[str, ArgValue]
"""A step argument: a value, or one level of named values (e.g. `health_check: {hold_s: 60}`)."""

# What every need fills in; parameters may not shadow these.
NEED_FIELDS: tuple[str, ...] = ("cluster", "pool", "target")

_FORMATTER = Formatter()


def placeholders(text: str) -> list[str]:
    """The names `text` refers to, in order; ValueError for anything but `{plain_name}`."""
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as err:  # e.g. "Single '}' encountered in format string"
        raise ValueError(f"{text!r} is not a valid template string: {err}") from err
    names: list[str] = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"{text!r}: only plain placeholders such as {{target}} are allowed"
            )
        names.append(name)
    return names


def unknown_placeholders(text: str, known: set[str]) -> list[str]:
    """The placeholders of `text` that `known` does not define (ValueError if malformed)."""
    return [name for name in placeholders(text) if name not in known]


def render(value: ArgValue, values: Mapping[str, Scalar]) -> ArgValue:
    """`value` with its placeholders filled in.

    A string that is exactly one placeholder takes the value's own type (`"{max_jobs}"` with
    max_jobs 1 gives the integer 1, which a strict action field needs); any other string is
    filled in as text. Non-strings are literals. Placeholders must have been checked first.
    """
    if not isinstance(value, str):
        return value
    parsed = list(_FORMATTER.parse(value))
    if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] is not None:
        return values[parsed[0][1]]
    return "".join(
        literal + ("" if name is None else str(values[name]))
        for literal, name, _, _ in parsed
    )


def render_arg(value: Arg, values: Mapping[str, Scalar]) -> Arg:
    """A step argument rendered: a mapping's values one by one (`render`)."""
    if isinstance(value, dict):
        return {key: render(item, values) for key, item in value.items()}
    return render(value, values)


def arg_texts(field: str, value: Arg) -> list[tuple[str, str]]:
    """The strings of an argument that may hold placeholders, each with its field's path."""
    if isinstance(value, dict):
        return [(f"{field}.{key}", item) for key, item in value.items()
                if isinstance(item, str)]
    return [(field, value)] if isinstance(value, str) else []


def render_text(text: str, values: Mapping[str, Scalar]) -> str:
    """`text` with its placeholders filled in, always as text (lock keys)."""
    return "".join(
        literal + ("" if name is None else str(values[name]))
        for literal, name, _, _ in _FORMATTER.parse(text)
    )
