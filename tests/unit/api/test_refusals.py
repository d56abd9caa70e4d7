"""Which refused authentications are audited (pure: the counts are given)."""

from __future__ import annotations

from datetime import UTC, datetime

from services.api.refusals import MAX_AUDITED_PAIRS, decide, window_of


def test_only_a_pairs_first_refusal_is_audited_up_to_the_cap() -> None:
    assert decide(1, 1) == "audit"
    assert decide(1, MAX_AUDITED_PAIRS) == "audit"
    assert decide(2, 0) == "count"
    assert decide(1000, 0) == "count"


def test_the_pair_past_the_cap_is_audited_once_as_the_cap_the_rest_counted() -> None:
    assert decide(1, MAX_AUDITED_PAIRS + 1) == "audit_cap"
    assert decide(1, MAX_AUDITED_PAIRS + 2) == "count"
    assert decide(1, 10 * MAX_AUDITED_PAIRS) == "count"


def test_a_window_is_named_by_its_index_and_begins_on_its_boundary() -> None:
    first = window_of(datetime(2026, 12, 2, 13, 56, 59, 999_000, tzinfo=UTC), 60)
    assert first.start == datetime(2026, 12, 2, 13, 56, tzinfo=UTC)
    second = window_of(datetime(2026, 12, 2, 13, 57, tzinfo=UTC), 60)
    assert second.index == first.index + 1
    assert second.start == datetime(2026, 12, 2, 13, 57, tzinfo=UTC)
