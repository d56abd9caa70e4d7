"""The store fixture: a migrated task store on each engine (see `database_url`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.store.db import Store, migrate, open_store


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    await migrate(database_url)
    opened = open_store(database_url)
    try:
        yield opened
    finally:
        await opened.close()
