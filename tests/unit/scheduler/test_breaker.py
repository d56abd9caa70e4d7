"""Table tests of the circuit breaker policy: trips, holds, half-open trials and resets."""

from __future__ import annotations

import pytest

from services.scheduler import breaker
from services.scheduler.breaker import BreakerConfig, BreakerState, Outcome
from services.scheduler.breaker_store import decode, encode
from services.scheduler.settings import SchedulerSettings
from services.shared.breaker_holds import stopped_nodes

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
        "kind", 0.1, 2)
    assert settings.breaker_config("offline").window_s == 3_600.0
    assert settings.rate_limited_kinds == ("offline", "scale_in", "remove_node")
    assert settings.budget_kinds == ("offline", "remove_node")


@pytest.mark.parametrize(
    ("scope", "name", "node"),
    [("kind", "offline", None), ("node", "offline@node-7", "node-7"),
     ("cluster", "offline@*", None)])
def test_the_scope_names_the_breaker(scope: breaker.BreakerScope, name: str,
                                     node: str | None) -> None:
    assert breaker.breaker_name("offline", "node-7", scope) == name
    assert breaker.kind_of(name) == "offline"
    assert (breaker.scope_of(name), breaker.node_of(name)) == (scope, node)
    assert breaker.holds_beyond_its_kind(name) == (scope != "kind")


@pytest.mark.parametrize(
    ("kind", "node", "scope", "name"),
    [("offline", None, None, "offline"), ("offline@n1", None, None, "offline@n1"),
     ("offline", "n1", None, "offline@n1"), ("offline@*", None, None, "offline@*"),
     ("offline", None, "cluster", "offline@*"), ("offline@*", None, "cluster", "offline@*")])
def test_an_operator_names_a_breaker_of_any_scope(kind: str, node: str | None,
                                                  scope: breaker.BreakerScope | None,
                                                  name: str) -> None:
    assert breaker.breaker_named(kind, node, scope) == name


@pytest.mark.parametrize(("kind", "node", "scope"),
                         [("offline@n1", "n2", None), ("offline@n1", None, "cluster"),
                          ("offline", None, "node"), ("offline@*", None, "kind")])
def test_names_that_disagree_are_refused(kind: str, node: str | None,
                                         scope: breaker.BreakerScope | None) -> None:
    with pytest.raises(ValueError, match=r"names another node|is not a"):
        breaker.breaker_named(kind, node, scope)


def test_a_node_or_cluster_breaker_holds_back_other_kinds_but_not_itself() -> None:
    holding = {"offline@node-1", "migrate@node-2"}
    assert breaker.blocking(holding, "online", "node-1") == "offline@node-1"
    assert breaker.blocking(holding, "online@node-1", "node-1") == "offline@node-1"
    # Its own breaker decides by `admits` (a half-open trial must get through).
    assert breaker.blocking(holding, "offline@node-1", "node-1") is None
    assert breaker.blocking(holding, "online", "node-3") is None
    assert breaker.blocking(holding | {"scale_in@*"}, "online", "node-3") == "scale_in@*"
    assert breaker.blocking({"scale_in@*"}, "scale_in@*", "node-3") is None
    assert stopped_nodes(holding | {"scale_in@*"}) == {"node-1", "node-2"}


# ------------------------------------------------------------------ the time window

WINDOWED = BreakerConfig(disruptive=True, window_s=60.0)


def at_times(marks: list[tuple[str, float]], config: BreakerConfig = WINDOWED) -> BreakerState:
    """Record ("F"/"S", time) outcomes in order."""
    state = BreakerState()
    for i, (mark, now) in enumerate(marks):
        state = breaker.record(state, Outcome(task_id=f"t{i}", failed=mark == "F"), now, config)
    return state


def test_failures_within_the_window_trip() -> None:
    state = at_times([("F", 0.0), ("F", 30.0), ("F", 59.0)])
    assert (state.status, state.consecutive_failures) == ("OPEN", 3)


def test_failures_older_than_the_window_do_not_count() -> None:
    # The first failure is 61 s old when the third arrives: two in the window, under every limit.
    state = at_times([("F", 0.0), ("F", 30.0), ("F", 61.0)])
    assert state.status == "CLOSED"
    assert (state.window, state.window_at, state.consecutive_failures) == (
        (True, True), (30.0, 61.0), 2)


def test_a_slow_trickle_of_failures_never_trips() -> None:
    # One failure every 40 s for an hour: never more than two within any minute.
    state = at_times([("F", 40.0 * i) for i in range(90)])
    assert state.status == "CLOSED"
    assert len(state.window) == 2


def test_the_rate_counts_only_the_outcomes_in_the_window() -> None:
    # Old successes would dilute the rate below 50 %; once they age out, the rate is 2 of 3.
    old = [("S", float(i)) for i in range(7)]
    assert at_times([*old, ("F", 50.0), ("S", 55.0), ("F", 58.0)]).status == "CLOSED"
    assert at_times([*old, ("F", 70.0), ("S", 75.0), ("F", 78.0)]).status == "OPEN"


def test_the_count_window_still_bounds_the_window() -> None:
    state = at_times([("F", 0.0), *[("S", 1.0 + i) for i in range(12)]],
                     BreakerConfig(window_s=3_600.0))
    assert len(state.window) == len(state.window_at) == 10


def test_outcomes_stored_without_a_time_no_longer_count() -> None:
    # A hash written before outcomes had times: its two failures are of unknown age.
    legacy = BreakerState(window=(True, True), consecutive_failures=2)
    state = breaker.record(legacy, Outcome(task_id="t", failed=True), 10.0, WINDOWED)
    assert (state.status, state.window, state.window_at) == ("CLOSED", (True,), (10.0,))


def test_releasing_the_trial_reopens_without_a_new_opening() -> None:
    state = half_open()
    released = breaker.release_trial(state, "trial")
    assert (released.status, released.trial_task, released.openings) == ("OPEN", "", 1)
    assert released.opened_at == state.opened_at
    # The wait was served already: the next task may be the trial at once.
    assert breaker.admits(released, 101.0, GENTLE).half_open_trial
    assert breaker.release_trial(state, "not-the-trial") == state
    assert breaker.release_trial(run("FFF"), "trial") == run("FFF")
