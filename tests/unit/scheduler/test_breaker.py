"""Table tests of the circuit breaker policy: trips, holds, half-open trials and resets."""

from __future__ import annotations

import pytest

from services.scheduler import breaker
from services.scheduler.breaker import BreakerConfig, BreakerState, Outcome
from services.scheduler.breaker_store import decode, encode
from services.scheduler.settings import SchedulerSettings

DISRUPTIVE = BreakerConfig(disruptive=True)
GENTLE = BreakerConfig(disruptive=False, wait_s=60.0)


def run(outcomes: str, config: BreakerConfig = DISRUPTIVE,
        state: BreakerState | None = None) -> BreakerState:
    """Record `outcomes` ("F" failed, "S" succeeded) one second apart, tasks t0, t1, ..."""
    state = state or BreakerState()
    for i, mark in enumerate(outcomes):
        state = breaker.record(state, Outcome(task_id=f"t{i}", failed=mark == "F"),
                               float(i), config)
    return state


@pytest.mark.parametrize(
    ("outcomes", "status"),
    [
        ("", "CLOSED"),
        ("F", "CLOSED"),
        ("FF", "CLOSED"),  # below the minimum number of calls
        ("FFF", "OPEN"),  # three in a row
        ("FSF", "OPEN"),  # 2 of 3 = 67% >= 50%
        ("SSF", "CLOSED"),  # 33%
        ("SSFF", "OPEN"),  # 50%
        ("SSSSSF", "CLOSED"),
        ("SSSSSFSFSF", "CLOSED"),  # 30% of 10
        ("SSSSSFSFSFSFS", "CLOSED"),  # last 10: 40%
        ("SSSSSFSFSFSFSF", "OPEN"),  # the window slid: its last 10 are 50% failures
        ("SSSSSSSSSSSSSSSSFSFSF", "CLOSED"),  # last 10: SSSSSFSFSF = 30%
        ("SFSFSF", "OPEN"),  # opened at the third outcome and stayed open
    ],
)
def test_the_window_trips_on_rate_or_consecutive_failures(outcomes: str, status: str) -> None:
    assert run(outcomes).status == status


def test_the_window_keeps_only_the_last_outcomes() -> None:
    state = run("F" + "S" * 12)
    assert state.window == (False,) * 10
    assert state.consecutive_failures == 0


def test_opening_counts_and_stamps_the_time() -> None:
    state = run("SSSFFF")
    assert (state.status, state.opened_at, state.openings) == ("OPEN", 5.0, 1)


def test_outcomes_arriving_while_open_change_nothing() -> None:
    state = run("FFF")
    assert run("SSSSSS", state=state) == state


@pytest.mark.parametrize(
    ("config", "since_open_s", "allowed", "trial", "reason"),
    [
        (DISRUPTIVE, 0.0, False, False, "open until an admin reset (disruptive)"),
        (DISRUPTIVE, 10**6, False, False, "open until an admin reset (disruptive)"),
        (GENTLE, 10.0, False, False, "open; half-open in 50 s"),
        (GENTLE, 59.9, False, False, "open; half-open in 0 s"),
        (GENTLE, 60.0, True, True, "half-open trial"),
    ],
)
def test_an_open_breaker_admits_only_what_its_kind_allows(
    config: BreakerConfig, since_open_s: float, allowed: bool, trial: bool, reason: str
) -> None:
    state = run("FFF", config)
    assert state.opened_at is not None
    decision = breaker.admits(state, state.opened_at + since_open_s, config)
    assert (decision.allowed, decision.half_open_trial, decision.reason) == (
        allowed, trial, reason)


def test_a_closed_breaker_admits() -> None:
    decision = breaker.admits(run("SSF"), 0.0, DISRUPTIVE)
    assert (decision.allowed, decision.half_open_trial) == (True, False)


def half_open() -> BreakerState:
    opened = run("FFF", GENTLE)
    return breaker.begin_trial(opened, "trial", 100.0)


def test_half_open_allows_exactly_one_trial() -> None:
    state = half_open()
    assert state.status == "HALF_OPEN"
    decision = breaker.admits(state, 101.0, GENTLE)
    assert (decision.allowed, decision.reason) == (False, "half-open trial in flight")


def test_a_lost_trial_is_replaced_after_the_half_open_limit() -> None:
    decision = breaker.admits(half_open(), 100.0 + GENTLE.max_half_open_s, GENTLE)
    assert (decision.allowed, decision.half_open_trial) == (True, True)


@pytest.mark.parametrize(
    ("task_id", "failed", "status", "openings"),
    [
        ("trial", False, "CLOSED", 1),
        ("trial", True, "OPEN", 2),
        ("older", True, "HALF_OPEN", 1),  # not the trial: ignored
        ("older", False, "HALF_OPEN", 1),
    ],
)
def test_the_trial_alone_decides_half_open(task_id: str, failed: bool, status: str,
                                           openings: int) -> None:
    after = breaker.record(half_open(), Outcome(task_id=task_id, failed=failed), 200.0, GENTLE)
    assert (after.status, after.openings) == (status, openings)
    if status == "CLOSED":
        assert after.window == ()
        assert after.consecutive_failures == 0
    if status == "OPEN":
        assert after.opened_at == 200.0


def test_a_reset_closes_with_an_empty_window_and_keeps_the_opening_count() -> None:
    after = breaker.reset(run("FFF"))
    assert after == BreakerState(openings=1)
    assert breaker.admits(after, 0.0, DISRUPTIVE).allowed


@pytest.mark.parametrize("state", [BreakerState(), run("SFFF"), half_open()])
def test_the_hash_encoding_round_trips(state: BreakerState) -> None:
    pairs = encode(state)
    raw = dict(zip(pairs[::2], pairs[1::2], strict=True)) | {"version": "7"}
    assert decode(raw) == (state, 7)


def test_settings_give_the_documented_defaults() -> None:
    settings = SchedulerSettings()
    offline = settings.breaker_config("offline")
    assert (offline.window, offline.min_calls, offline.failure_rate_pct,
            offline.consecutive_failures, offline.wait_s) == (10, 3, 50.0, 3, 60.0)
    assert offline.disruptive
    assert settings.breaker_config("scale_in").disruptive
    assert settings.breaker_config("load_balance").disruptive
    assert not settings.breaker_config("online").disruptive
    assert not settings.breaker_config("scale_out").disruptive


def test_the_settings_add_the_child_kinds_the_scope_and_the_rate_limit() -> None:
    settings = SchedulerSettings()
    assert settings.breaker_config("migrate").disruptive
    assert settings.breaker_config("remove_node").disruptive
    assert (settings.breaker_scope, settings.rate_per_s, settings.rate_burst) == (
        "cluster", 0.1, 2)
    assert settings.rate_limited_kinds == ("offline", "scale_in", "remove_node")
    assert settings.budget_kinds == ("offline", "remove_node")


@pytest.mark.parametrize(
    ("scope", "name"), [("cluster", "offline"), ("node", "offline@node-7")])
def test_the_scope_names_the_breaker(scope: breaker.BreakerScope, name: str) -> None:
    assert breaker.breaker_name("offline", "node-7", scope) == name
    assert breaker.kind_of(name) == "offline"


def test_releasing_the_trial_reopens_without_a_new_opening() -> None:
    state = half_open()
    released = breaker.release_trial(state, "trial")
    assert (released.status, released.trial_task, released.openings) == ("OPEN", "", 1)
    assert released.opened_at == state.opened_at
    # The wait was served already: the next task may be the trial at once.
    assert breaker.admits(released, 101.0, GENTLE).half_open_trial
    assert breaker.release_trial(state, "not-the-trial") == state
    assert breaker.release_trial(run("FFF"), "trial") == run("FFF")
