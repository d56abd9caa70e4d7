"""Hypothesis strategies for malformed messages: a valid event's JSON broken in one way that
its strict model must refuse, whatever else the break leaves intact.

Every defect is invalid by construction (the tests assert that nothing of it is acted on, so
a generated input must never be a valid event by chance): a proper prefix of a JSON object,
bytes that are not UTF-8 or not JSON, a field the model does not know, a value of another
JSON type than its field's (strict models coerce nothing), a number beyond every bound of
the contract or not finite, an identifier outside its pattern, a required field left out, a
schema version other than 1, a body over the size limit, nesting deeper than any event.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st
from pydantic import BaseModel

from schemas.envelope import IDENTIFIER_MAX

JsonPath = tuple[str | int, ...]
Json = Any

NON_FINITE: Final = "__NON_FINITE__"  # stands for a NaN or infinity token until encoded
IDENTIFIER: Final = re.compile(rf"^[A-Za-z0-9_.-]{{1,{IDENTIFIER_MAX}}}$")
DEFECTS: Final = ("garbage", "truncated", "not_utf8", "nested", "oversize", "extra_field",
                  "wrong_type", "beyond_bounds", "non_finite", "bad_identifier", "missing",
                  "schema_version")


@dataclass(frozen=True)
class Shape:
    """A valid event as JSON data, and where breaking it is certain to make it invalid."""

    base: dict[str, Json]
    required: tuple[JsonPath, ...]  # leaving any one out is invalid
    identifiers: tuple[JsonPath, ...]  # strings that must match IDENTIFIER
    limit: int  # the size limit of its topic

    @classmethod
    def of(cls, event: BaseModel, identifiers: Sequence[JsonPath], limit: int,
           nested: Sequence[tuple[JsonPath, type[BaseModel]]] = ()) -> Shape:
        """`event`'s shape: its model's required fields and those of the nested models at
        `nested` (path of an object -> its model) are the ones that may go missing."""
        required: list[JsonPath] = [(name,) for name, info in type(event).model_fields.items()
                                    if info.is_required()]
        for path, model in nested:
            required += [(*path, name) for name, info in model.model_fields.items()
                         if info.is_required()]
        return cls(json.loads(event.model_dump_json()), tuple(required), tuple(identifiers),
                   limit)


def nodes(data: Json, prefix: JsonPath = ()) -> list[tuple[JsonPath, Json]]:
    """Every value inside `data` with its path (containers and leaves, not the root)."""
    found: list[tuple[JsonPath, Json]] = []
    items: list[tuple[str | int, Json]] = (
        list(data.items()) if isinstance(data, dict)
        else list(enumerate(data)) if isinstance(data, list) else [])
    for key, value in items:
        path = (*prefix, key)
        found.append((path, value))
        found += nodes(value, path)
    return found


def objects(data: Json) -> list[JsonPath]:
    """The paths of every JSON object in `data`, the root included."""
    return [()] + [path for path, value in nodes(data) if isinstance(value, dict)]


def at(data: Json, path: JsonPath) -> Json:
    for key in path:
        data = data[key]
    return data


def replaced(data: dict[str, Json], path: JsonPath, value: Json) -> dict[str, Json]:
    changed = copy.deepcopy(data)
    at(changed, path[:-1])[path[-1]] = value
    return changed


def deleted(data: dict[str, Json], path: JsonPath) -> dict[str, Json]:
    changed = copy.deepcopy(data)
    del at(changed, path[:-1])[path[-1]]
    return changed


def encoded(data: Json, non_finite: str = "NaN") -> bytes:
    return json.dumps(data).encode().replace(f'"{NON_FINITE}"'.encode(), non_finite.encode())


def of_another_type(value: Json) -> st.SearchStrategy[Json]:
    """JSON values none of which a strict field holding `value` accepts: another JSON type
    (a string for a number, a number or a list for a string, a list or an object for null)."""
    text = st.text(max_size=6)
    number = st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False))
    a_list = st.lists(st.integers(0, 9), min_size=1, max_size=2)
    an_object = st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 9),
                                min_size=1, max_size=1)
    if isinstance(value, bool):
        return st.one_of(text, a_list, an_object)
    if isinstance(value, int | float):
        return st.one_of(text, st.booleans(), a_list, an_object)
    if isinstance(value, str):
        return st.one_of(number, st.booleans(), a_list, an_object)
    if isinstance(value, list):
        return st.one_of(text, number, st.booleans(), an_object)
    if isinstance(value, dict):
        return st.one_of(text, number, st.booleans(), a_list)
    return st.one_of(a_list, an_object)  # null: an optional field, which takes a scalar


def not_identifiers() -> st.SearchStrategy[str]:
    """Strings outside ^[A-Za-z0-9_.-]{1,128}$: empty, too long, or with a character such as
    `;`, `/`, a space or a newline."""
    return st.one_of(
        st.just(""),
        st.text(alphabet="abc", min_size=IDENTIFIER_MAX + 1, max_size=IDENTIFIER_MAX + 3),
        st.builds(lambda head, bad, tail: head + bad + tail,
                  st.text(alphabet="abc-._019", max_size=8),
                  st.sampled_from([";", "/", " ", "\n", "$(", "`", "'", "\\", "é", "\x00",
                                   "|", "&", "*", ":", "\u202e"]),
                  st.text(max_size=8)),
    ).filter(lambda s: not IDENTIFIER.match(s))


@st.composite
def broken(draw: st.DrawFn, shape: Shape) -> tuple[str, bytes]:
    """(defect, bytes) of an event of `shape` broken by one defect (see the module doc)."""
    base = shape.base
    valid = encoded(base)
    defect = draw(st.sampled_from(DEFECTS))
    if defect == "garbage":
        body: bytes = draw(st.binary(max_size=200))
    elif defect == "truncated":
        body = valid[:draw(st.integers(0, len(valid) - 1))]
    elif defect == "not_utf8":
        cut = draw(st.integers(0, len(valid)))
        body = valid[:cut] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])) + \
            valid[cut:]
    elif defect == "nested":
        depth = draw(st.integers(1, shape.limit // 2))
        body = draw(st.sampled_from([b"[", b'{"a":'])) * depth
    elif defect == "oversize":
        body = encoded(base | {"pad": "x" * shape.limit})
    elif defect == "extra_field":
        where = draw(st.sampled_from(objects(base)))
        name = draw(st.text(min_size=1, max_size=8).filter(lambda n: n not in at(base, where)))
        body = encoded(replaced(base, (*where, name), draw(st.sampled_from(
            [None, 0, "rm -rf /", [], {}]))))
    elif defect == "wrong_type":
        path, value = draw(st.sampled_from(nodes(base)))
        body = encoded(replaced(base, path, draw(of_another_type(value))))
    elif defect in ("beyond_bounds", "non_finite"):
        numbers = [path for path, value in nodes(base)
                   if isinstance(value, int | float) and not isinstance(value, bool)]
        path = draw(st.sampled_from(numbers))
        if defect == "beyond_bounds":
            # Every number of the contract is bounded far below these (its ge/le).
            body = encoded(replaced(base, path, draw(st.sampled_from(
                [10**20, -(10**20), 1e300, -1e300, 2**64]))))
        else:
            body = encoded(replaced(base, path, NON_FINITE), draw(st.sampled_from(
                ["NaN", "Infinity", "-Infinity", "1e999"])))
    elif defect == "bad_identifier":
        path = draw(st.sampled_from(shape.identifiers))
        body = encoded(replaced(base, path, draw(not_identifiers())))
    elif defect == "missing":
        body = encoded(deleted(base, draw(st.sampled_from(shape.required))))
    else:  # schema_version
        version = draw(st.one_of(st.integers().filter(lambda v: v != 1), st.text(max_size=3),
                                 st.just(None), st.just(1.5)))
        body = encoded(base | {"schema_version": version})
    return defect, body
