"""Fixtures: the real Kafka broker and redis-server, found in the environment first.

`make test` starts both from the project's own scripts and exports their addresses. Where
they are not set and a Docker engine answers, testcontainers starts them; otherwise the
integration tests are skipped with the reason (and `make test` never lets that happen).

`database_url` runs a test twice: on a SQLite file and on PostgreSQL (DATABASE_URL_POSTGRES,
which `make test` exports after starting deploy/local/postgres.sh), each time on an empty
database of its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine


def _docker_engine_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        client.ping()
        return True
    except Exception:
        return False
    finally:
        client.close()  # its socket, left open, is a ResourceWarning (an error here)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    if url := os.getenv("KAFKA_BOOTSTRAP_SERVERS"):
        yield url
        return
    if not _docker_engine_available():
        pytest.skip("no KAFKA_BOOTSTRAP_SERVERS and no Docker engine (run `make test`)")
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if url := os.getenv("REDIS_URL"):
        yield url
        return
    if not _docker_engine_available():
        pytest.skip("no REDIS_URL and no Docker engine (run `make test`)")
    from testcontainers.community.redis import RedisContainer

    with RedisContainer("redis:7.4") as redis:
        host, port = redis.get_container_host_ip(), redis.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test: its own topics, consumer groups and Redis keys."""
    return f"t{uuid4().hex[:12]}"


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database: a SQLite file, then a fresh PostgreSQL database (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}"
        return
    base = os.getenv("DATABASE_URL_POSTGRES")
    if not base:
        pytest.skip("no DATABASE_URL_POSTGRES (run `make test`, which starts PostgreSQL)")
    name = f"t_{uuid4().hex[:20]}"
    # CREATE/DROP DATABASE cannot run inside a transaction.
    admin = create_async_engine(base, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
        async with admin.connect() as conn:
            # FORCE: a test that failed may have left a connection open.
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()
