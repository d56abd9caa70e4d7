"""A Redis that answers but refuses is an outage, not a bad message: each refusal, as the
client raises it from Redis's reply, waits (nothing dead-lettered, nothing committed); a reply
error caused by the command itself still dead-letters; and the settings hold a Redis call to
5 s (the refusals on the real redis-server: tests/service/shared/test_redis_refusals.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.deadletter import classify
from common.errors import RedisRefused
from common.settings import ServiceSettings
from services.shared.redis_client import _RefusalParser

# The client leaves its parser untyped; it returns the exception a reply error raises.
parse_error = cast(Callable[[str], ResponseError], _RefusalParser.parse_error)

# Replies as redis-server 7 sends them (the leading '-' stripped, as the parser receives them).
REFUSALS = [
    "READONLY You can't write against a read only replica.",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
    "to disk.",
    "NOPERM this user has no permissions to run the 'set' command",
    "LOADING Redis is loading the dataset in memory",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "NOREPLICAS Not enough good replicas to write.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "CLUSTERDOWN The cluster is down",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    # From inside a script: the code of the command the script called is kept.
    "OOM command not allowed when used memory > 'maxmemory'. script: d8f2, on @user_script:1.",
]


@pytest.mark.parametrize("reply", REFUSALS, ids=[r.split()[0] + str(i) for i, r in
                                                  enumerate(REFUSALS)])
def test_every_refusal_waits(reply: str) -> None:
    error = parse_error(reply)
    assert classify(error)[:2] == ("wait", "infrastructure_unavailable")


@pytest.mark.parametrize("code", ["MISCONF", "BUSY", "NOREPLICAS"])
def test_refusals_the_client_knows_no_class_for_get_one(code: str) -> None:
    assert isinstance(parse_error(f"{code} refused"), RedisRefused)


def test_a_refusal_raised_from_a_store_waits_as_well() -> None:
    outage = RuntimeError("could not record the task")
    outage.__cause__ = parse_error("READONLY You can't write against a replica.")
    assert classify(outage)[0] == "wait"


@pytest.mark.parametrize("error", [RedisConnectionError("refused"), RedisTimeoutError("read"),
                                   ConnectionResetError("reset")])
def test_an_unreachable_redis_waits(error: Exception) -> None:
    assert classify(error)[0] == "wait"


@pytest.mark.parametrize("reply", [
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "ERR value is not an integer or out of range",
    "ERR Error running script (call to f_1): @user_script:1: user_script:1: bad argument",
])
def test_an_error_of_the_command_itself_still_dead_letters(reply: str) -> None:
    error = parse_error(reply)
    assert type(error) is ResponseError
    assert classify(error)[0] == "dead_letter"


def test_a_redis_call_is_bounded_to_five_seconds_in_all() -> None:
    defaults = ServiceSettings()
    assert defaults.redis_connect_timeout_s + defaults.redis_read_timeout_s <= 5.0
    ServiceSettings(redis_connect_timeout_s=1.0, redis_read_timeout_s=4.0)
    with pytest.raises(ValidationError, match="at most 5 s"):
        ServiceSettings(redis_connect_timeout_s=2.0, redis_read_timeout_s=5.0)
