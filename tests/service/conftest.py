"""Fixtures for service tests of Redis adapters: the real redis-server at REDIS_URL, and a fresh
key namespace per test whose keys are deleted afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from services.shared.redis_client import Keys, connect_redis


@pytest.fixture
def keys() -> Keys:
    return Keys(f"u{uuid4().hex}")


@pytest.fixture
async def redis(redis_url: str, keys: Keys) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    try:
        yield client
    finally:
        stale = [key async for key in client.scan_iter(match=f"{keys.prefix}*", count=1000)]
        if stale:
            await client.delete(*stale)
        await client.aclose()
