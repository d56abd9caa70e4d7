"""The journal's named records: the fields an operator's transition patches into a workflow,
and a pause request as the journal keeps it."""

from __future__ import annotations

from services.executor.journal import Patch, PauseRequest

FRESH_STEP = {"step_state": "scheduled", "attempt": "0", "run": "3", "command_id": "",
              "query_id": "", "waiting": "0", "cause": "", "reason": "", "pause": ""}


def test_a_fresh_run_starts_the_step_over_with_nothing_left_of_the_last_run() -> None:
    assert Patch(state="running", fresh_run=3).fields() == {**FRESH_STEP, "state": "running"}
    assert Patch(state="paused", step=2, fresh_run=3).fields() == {
        **FRESH_STEP, "state": "paused", "step": "2"}


def test_a_patch_sets_only_what_it_names() -> None:
    assert Patch(state="paused").fields() == {"state": "paused"}
    assert Patch(clear_pause=True).fields() == {"pause": ""}
    assert Patch(state="terminated", cause="terminated", reason="terminate: x",
                 clear_pause=True).fields() == {
        "state": "terminated", "cause": "terminated", "reason": "terminate: x", "pause": ""}


def test_a_pause_request_round_trips_and_reads_an_incomplete_one() -> None:
    request = PauseRequest("alice", "look first", "k1")
    assert Patch(pause=request).fields() == {"pause": request.to_json()}
    assert PauseRequest.from_json(request.to_json()) == request
    assert PauseRequest.from_json('{"actor": "bob"}') == PauseRequest("bob", "", "")
