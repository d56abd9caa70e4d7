"""Text cut to fit the contract: `short_text` fits ShortText, `reason_text` fits Reason."""

from __future__ import annotations

from pydantic import TypeAdapter

from schemas.envelope import Reason, ShortText, reason_text, short_text


def test_short_text_keeps_what_fits_and_cuts_the_rest_to_a_valid_short_text() -> None:
    assert short_text("drained") == "drained"
    cut = short_text("x" * 300)
    assert cut == "x" * 256
    assert TypeAdapter(ShortText).validate_python(cut) == cut


def test_reason_text_keeps_what_fits_and_cuts_the_rest_to_a_valid_reason() -> None:
    assert reason_text("maintenance") == "maintenance"
    cut = reason_text("y" * 501)
    assert cut == "y" * 500
    assert TypeAdapter(Reason).validate_python(cut) == cut
