"""Fixtures: the real Kafka broker and redis-server, found in the environment first.

`make test` starts both from the project's own scripts and exports their addresses. Where
they are not set and a Docker engine answers, testcontainers starts them; otherwise the
integration tests are skipped with the reason (and `make test` never lets that happen).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from uuid import uuid4

import pytest


def _docker_engine_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


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
