"""Fixtures: the real Kafka broker, redis-server, PostgreSQL and chromium, found in the
environment (`make test` starts the servers from the project's own scripts and exports their
addresses; deploy/local/chromium.sh installs the browser).

A test that needs one of them fails, never skips, when it is missing: a green run with parts
left out would hide exactly what the run is for. `make unit` runs only the tests that need
none (tests/suite.py sorts the tests by what they need).

`database_url` runs a test twice: on a SQLite file and on PostgreSQL (DATABASE_URL_POSTGRES,
which `make test` exports after starting deploy/local/postgres.sh), each time on an empty
database of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from redis import Redis as SyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from services.backends.kubernetes.connection import KubeAccess, connect
from tests.kube import KubeScope
from tests.ports import free_port
from tests.waiting import wait_until


def required(variable: str, what: str) -> str:
    """The address of a service the test needs, from the environment, or a failed test."""
    if value := os.getenv(variable):
        return value
    pytest.fail(f"{what} is needed and {variable} is not set: run `make test` (it starts "
                f"the services), or `make up` and `source deploy/local/env.sh`", pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return required("KAFKA_BOOTSTRAP_SERVERS", "the Kafka broker")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return required("REDIS_URL", "redis-server")


def redis_answers(url: str) -> bool:
    """Whether the redis-server at `url` answers a PING now."""
    client = SyncRedis.from_url(url, socket_connect_timeout=1.0)
    try:
        return bool(client.ping())
    except RedisConnectionError:
        return False
    finally:
        client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own, which the test may stop: its URL and process."""
    port = free_port()
    data = tmp_path / "private-redis"  # a folder of its own, which a test may take away
    data.mkdir()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: redis_answers(url),
                   f"the private redis-server on port {port} answering")
        yield url, server
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:  # e.g. a server that cannot save refuses to stop
            server.kill()
            server.wait(10)


@pytest.fixture(scope="session")
def alertmanager_url() -> str:
    return required("ALERTMANAGER_URL", "Prometheus Alertmanager")


@pytest.fixture(scope="session")
def kube_api() -> KubeAccess:
    """An admin's access to the real Kubernetes API server deploy/local/kubernetes.sh runs."""
    kubeconfig = required("KUBECONFIG_CLUSTERWARDEN", "the Kubernetes API server")
    if not Path(kubeconfig).is_file():
        pytest.fail(f"no kubeconfig at {kubeconfig}: deploy/local/kubernetes.sh start writes it",
                    pytrace=False)
    return KubeAccess(kubeconfig=kubeconfig)


@pytest.fixture
async def kube(kube_api: KubeAccess) -> AsyncIterator[KubeScope]:
    """A namespace and node-name prefix of this test's own on that server, removed after."""
    api = await connect(kube_api)
    scope = KubeScope(api=api, prefix=f"t{uuid4().hex[:10]}")
    try:
        await scope.open()
        yield scope
    finally:
        try:
            await scope.close()
        finally:
            await api.close()


@pytest.fixture(scope="session")
def helm_binary() -> str:
    """The helm deploy/local/helm.sh builds and caches (`make setup` builds it; HELM names
    another one)."""
    if path := os.getenv("HELM"):
        return path
    script = Path(__file__).resolve().parents[1] / "deploy" / "local" / "helm.sh"
    answer = subprocess.run([str(script), "path"], capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        pytest.fail(f"no helm: {script} path failed: {answer.stderr}", pytrace=False)
    return answer.stdout.strip()


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (CHROMIUM names another one); the tests never download a browser."""
    path = os.getenv("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        pytest.fail(f"no chromium at {path}: deploy/local/chromium.sh installs Debian's",
                    pytrace=False)
    return path


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
    base = required("DATABASE_URL_POSTGRES", "PostgreSQL")
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
