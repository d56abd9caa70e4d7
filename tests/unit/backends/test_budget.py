"""The eviction budget: a token bucket on an injected clock."""

from __future__ import annotations

import pytest

from services.backends.budget import TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_the_burst_goes_at_once_then_one_token_per_interval() -> None:
    time = FakeTime()
    bucket = TokenBucket(rate_per_s=2.0, burst=3, clock=time.clock, sleep=time.sleep)
    for _ in range(3):
        await bucket.acquire()
    assert time.slept == []
    await bucket.acquire()
    await bucket.acquire()
    assert time.slept == [pytest.approx(0.5), pytest.approx(0.5)]
    assert bucket.taken == 5


async def test_idle_time_refills_up_to_the_burst_only() -> None:
    time = FakeTime()
    bucket = TokenBucket(rate_per_s=1.0, burst=2, clock=time.clock, sleep=time.sleep)
    await bucket.acquire()
    await bucket.acquire()
    time.now += 100
    assert bucket.wait_s() == 0
    await bucket.acquire()
    await bucket.acquire()
    assert time.slept == []
    assert bucket.wait_s() == pytest.approx(1.0)


def test_a_budget_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(rate_per_s=0, burst=1)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate_per_s=1, burst=0)
