"""Template strings: plain named placeholders only, typed when a string is one placeholder."""

from __future__ import annotations

import pytest

from services.templater.placeholders import (
    ArgValue,
    Scalar,
    placeholders,
    render,
    render_text,
)

VALUES: dict[str, Scalar] = {"target": "node-002", "pool": "default", "jobs": 2, "fast": True}


@pytest.mark.parametrize(
    ("text", "names"),
    [("node.{target}", ["target"]), ("{pool}-{target}", ["pool", "target"]),
     ("plain", []), ("{{target}}", []), ("", [])],
)
def test_placeholders(text: str, names: list[str]) -> None:
    assert placeholders(text) == names


@pytest.mark.parametrize(
    "text", ["{}", "{0}", "{target.upper}", "{target[0]}", "{pool!r}", "{pool:>8}", "{pool",
             "pool}"],
)
def test_anything_but_a_plain_name_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"only plain placeholders|not a valid template string"):
        placeholders(text)


@pytest.mark.parametrize(
    ("value", "rendered"),
    [("{jobs}", 2), ("{fast}", True), ("{target}", "node-002"), ("{pool}-{jobs}", "default-2"),
     ("{{x}}", "{x}"), (3, 3), (None, None), (False, False)],
)
def test_render(value: ArgValue, rendered: ArgValue) -> None:
    assert render(value, VALUES) == rendered


def test_render_text_is_always_text() -> None:
    assert render_text("tpl.{jobs}", VALUES) == "tpl.2"
    assert render_text("{jobs}", VALUES) == "2"
