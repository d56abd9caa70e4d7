"""Waiting for a condition, the one way the suite waits: poll until it holds, return at once
when it does, and fail with what was awaited after a deadline generous enough that only a
broken part reaches it (a slow or loaded machine never does). Tests assert what happened,
never how fast; speed is measured in bench/."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

# How long a test waits for something that normally takes milliseconds.
DEADLINE_S = 30.0

T = TypeVar("T")


class Patience:
    """A deadline that fails the test, saying what it waited for and what it saw last."""

    def __init__(self, what: str | Callable[[], str], timeout_s: float) -> None:
        self.what, self.timeout_s = what, timeout_s
        self.end = time.monotonic() + timeout_s

    def give_up_if_over(self, last: object) -> None:
        if time.monotonic() >= self.end:
            what = self.what if isinstance(self.what, str) else self.what()
            raise AssertionError(
                f"{what}: still not so after {self.timeout_s:g} s (last: {last!r})")


def wait_until(check: Callable[[], T | None], what: str | Callable[[], str], *,
               timeout_s: float = DEADLINE_S, poll_s: float = 0.01) -> T:
    """Poll `check` until it returns something true, and return that."""
    patience = Patience(what, timeout_s)
    while not (value := check()):
        patience.give_up_if_over(value)
        time.sleep(poll_s)
    return value


async def eventually(check: Callable[[], T | Awaitable[T | None] | None],
                     what: str | Callable[[], str], *, timeout_s: float = DEADLINE_S,
                     poll_s: float = 0.01) -> T:
    """`wait_until` without blocking the event loop; `check` may be a coroutine function."""
    patience = Patience(what, timeout_s)
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        patience.give_up_if_over(value)
        await asyncio.sleep(poll_s)
