"""The health decisions (common/health/policy.py): what each phase and each set of
answers makes /livez and /readyz say."""

from __future__ import annotations

import pytest

from common.health.policy import (
    MAX_DETAIL_CHARS,
    CheckResult,
    Phase,
    checks_to_run,
    liveness,
    readiness,
)

KAFKA_OK = CheckResult("kafka", True)
REDIS_OK = CheckResult("redis", True)
REDIS_DOWN = CheckResult("redis", False, "no answer within 2 s")


@pytest.mark.parametrize(("phase", "expected"), [
    (Phase.STARTING, []),
    (Phase.RUNNING, ["kafka", "redis"]),
    (Phase.STOPPING, []),
])
def test_dependencies_are_asked_only_while_the_process_runs(phase: Phase,
                                                            expected: list[str]) -> None:
    assert checks_to_run(phase, ["kafka", "redis"]) == expected


def test_ready_once_started_while_every_dependency_answers() -> None:
    answer = readiness(Phase.RUNNING, [KAFKA_OK, REDIS_OK])
    assert answer.status == 200
    assert answer.body == {"status": "ready", "checks": {"kafka": "ok", "redis": "ok"}}


def test_a_dependency_that_does_not_answer_is_named() -> None:
    answer = readiness(Phase.RUNNING, [KAFKA_OK, REDIS_DOWN])
    assert answer.status == 503
    assert answer.body["failed"] == ["redis"]
    assert answer.body["reason"] == "redis: no answer within 2 s"
    assert answer.body["checks"] == {"kafka": "ok", "redis": "no answer within 2 s"}


@pytest.mark.parametrize(("phase", "status"), [(Phase.STARTING, "starting"),
                                               (Phase.STOPPING, "stopping")])
def test_not_ready_before_start_up_has_finished_nor_while_stopping(phase: Phase,
                                                                  status: str) -> None:
    answer = readiness(phase, [])
    assert (answer.status, answer.body["status"]) == (503, status)


def test_a_long_reason_is_cut() -> None:
    answer = readiness(Phase.RUNNING, [CheckResult("database", False, "x" * 5_000)])
    assert len(str(answer.body["reason"])) == MAX_DETAIL_CHARS


def test_alive_while_nothing_has_ended() -> None:
    assert liveness(Phase.RUNNING, []).status == 200


def test_a_loop_or_consumer_that_ended_is_a_death_with_its_name() -> None:
    answer = liveness(Phase.RUNNING, ["dispatcher", "consumer warden.scheduler"])
    assert answer.status == 503
    assert answer.body["ended"] == ["dispatcher", "consumer warden.scheduler"]
    assert answer.body["reason"] == "ended: dispatcher, consumer warden.scheduler"


@pytest.mark.parametrize("phase", [Phase.STARTING, Phase.STOPPING])
def test_what_ends_before_the_start_or_during_the_stop_is_no_death(phase: Phase) -> None:
    # A stopping service cancels its own loops; restarting it then would help nothing.
    assert liveness(phase, ["dispatcher"]).status == 200
