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


class LateTime(FakeTime):
    """A busy event loop: every sleep ends `late` seconds after it was due."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + self.late


async def test_late_wake_ups_are_made_up_so_the_budget_is_kept_on_a_busy_loop() -> None:
    # 5/s with a burst of 1, every wake-up 65 ms late (the executor's loop at 1,000 nodes):
    # a refill counted from the wake-up made it one eviction per 0.265 s, 3.8/s.
    time = LateTime(late=0.065)
    bucket = TokenBucket(rate_per_s=5.0, burst=1, clock=time.clock, sleep=time.sleep)
    granted = []
    for _ in range(41):
        await bucket.acquire()
        granted.append(time.now)
    rate = (len(granted) - 1) / (granted[-1] - granted[0])
    assert rate == pytest.approx(5.0, rel=0.02)
    # Never ahead of the budget: at most burst + rate x span by any span's end.
    for i, at in enumerate(granted):
        assert i + 1 <= 1 + 5.0 * (at - granted[0]) + 1e-9


def test_a_budget_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(rate_per_s=0, burst=1)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate_per_s=1, burst=0)
