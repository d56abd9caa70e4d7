"""Fixtures for the scheduler's tests (`redis` and `keys` come from tests/unit/conftest.py)."""

from __future__ import annotations

import pytest

from tests.unit.scheduler.helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()
