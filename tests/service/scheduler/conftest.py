"""Fixtures for the scheduler's tests (`redis` and `keys` come from tests/service/conftest.py)."""

from __future__ import annotations

import pytest

from tests.service.scheduler.helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()
