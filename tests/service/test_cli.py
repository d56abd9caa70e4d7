"""`warden breaker list` on the real redis-server (`warden breaker reset` goes through the API:
tests/service/api/test_cli_api.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from uuid import uuid4

import pytest
from typer.testing import CliRunner

from services.scheduler.breaker import Outcome
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, connect_redis
from warden.cli import app


def _open_breaker(redis_url: str, namespace: str, cluster: str, name: str) -> None:
    """Three failures in a row: the breaker opens."""

    async def run() -> None:
        redis = connect_redis(redis_url)
        try:
            store = BreakerStore(redis, Keys(namespace), SchedulerSettings().breaker_config)
            for _ in range(3):
                await store.record(cluster, name, Outcome(task_id=uuid4().hex, failed=True))
        finally:
            await redis.aclose()

    asyncio.run(run())


@pytest.fixture
def env(redis_url: str, namespace: str) -> Iterator[dict[str, str]]:
    """The CLI's environment: the test's own namespace, whose keys go afterwards."""
    yield {"REDIS_URL": redis_url, "WARDEN_NAMESPACE": namespace}

    async def clean() -> None:
        redis = connect_redis(redis_url)
        try:
            stale = [k async for k in redis.scan_iter(match=f"{Keys(namespace).prefix}*",
                                                          count=1000)]
            if stale:
                await redis.delete(*stale)
        finally:
            await redis.aclose()

    asyncio.run(clean())


def test_breaker_list_shows_each_breaker_state(
        redis_url: str, namespace: str, env: dict[str, str]) -> None:
    runner = CliRunner()
    empty = runner.invoke(app, ["breaker", "list"], env=env)
    assert "no breaker has recorded an outcome yet" in empty.output
    _open_breaker(redis_url, namespace, "c1", "offline")
    _open_breaker(redis_url, namespace, "c2", "migrate@node-4")
    result = runner.invoke(app, ["breaker", "list"], env=env)
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()
    assert first.split()[:4] == ["c1", "offline", "OPEN", "window"]
    assert "FFF" in first
    assert second.split()[:3] == ["c2", "migrate@node-4", "OPEN"]
    only = runner.invoke(app, ["breaker", "list", "--cluster", "c2"],
                         env=env)
    assert only.output.splitlines() == [second]
