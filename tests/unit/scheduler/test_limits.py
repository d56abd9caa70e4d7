"""The dedup keys of the scheduler's alerts stay identifiers, however long what they name
(pure; the limits on the real redis-server are in tests/service/scheduler/test_limits.py)."""

from __future__ import annotations

from services.scheduler.handlers import dedup_key


def test_dedup_keys_stay_identifiers() -> None:
    assert dedup_key("breaker", "c1", "offline@node-1") == "breaker.c1.offline.node-1"
    long = dedup_key("breaker", "c" * 128, "offline@" + "n" * 128)
    assert len(long) == 128
    assert long != dedup_key("breaker", "c" * 128, "offline@" + "n" * 127 + "m")
