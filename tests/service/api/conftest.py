"""The API against a real store (SQLite file, then PostgreSQL when DATABASE_URL_POSTGRES is set),
the real redis-server and, for controls and alerts, the real Kafka broker.

The app runs in the test's own event loop (its lifespan entered by hand, requests through
httpx's ASGI transport), so a test can record task events and read Redis beside it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from aiokafka import AIOKafkaConsumer
from pydantic import SecretStr
from starlette.types import ASGIApp

from common.clock import Clock
from schemas.events.v1 import TaskEvent, now_utc
from schemas.topics import Topic, topic_name
from services.api.app import create_api
from services.api.auth import Role
from services.api.deps import Runtime
from services.api.settings import ApiSettings
from services.store.queries import list_audit
from services.store.recorder import Recorder
from services.store.views import AuditRow
from services.templater.templates import TEMPLATE_DIR

TOKENS: dict[Role, str] = {
    "node": "node-bootstrap-token-0123456789",
    "viewer": "viewer-token-0123456789",
    "operator": "operator-token-0123456789",
    "admin": "admin-token-0123456789",
}
USERS: dict[Role, str] = {"node": "bootstrap", "viewer": "vera", "operator": "otto",
                          "admin": "ada"}
# A broker address nothing listens on: publishing fails fast.
DEAD_KAFKA = "127.0.0.1:1"


def token_setting() -> str:
    return ",".join(f"{TOKENS[r]}:{USERS[r]}:{r}" for r in TOKENS)


def auth(role: Role) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@dataclass
class Api:
    """A running API: its HTTP client and its runtime (store, Redis, keys...)."""

    client: httpx.AsyncClient
    runtime: Runtime
    settings: ApiSettings

    async def record(self, events: Iterable[TaskEvent]) -> None:
        recorder = Recorder(self.runtime.store)
        for event in events:
            await recorder.record(event)

    async def audit(self) -> list[AuditRow]:
        """The audit log, oldest first."""
        async with self.runtime.store.session() as session:
            rows, _ = await list_audit(session, limit=500)
        return list(reversed(rows))

    async def get(self, path: str, role: Role | None = "viewer", **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params,
                                     headers=auth(role) if role else {})

    async def post(self, path: str, body: Any, role: Role | None = "operator") -> httpx.Response:
        return await self.client.post(path, json=body, headers=auth(role) if role else {})

    async def put(self, path: str, body: Any, role: Role | None = "admin") -> httpx.Response:
        return await self.client.put(path, json=body, headers=auth(role) if role else {})


class Server:
    """The API (or an app wrapping it) under uvicorn on a free port, in a thread with its own
    event loop."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="warning"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self.server.serve(),), daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(200):
            if self.server.started:
                return self
            deadline.wait(0.05)
        raise RuntimeError("the API did not start")

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def call(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Run a coroutine in the server's loop (where the store and Redis connections live)."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result(30)


@pytest.fixture
def template_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "templates"
    shutil.copytree(TEMPLATE_DIR, folder)
    return folder


@pytest.fixture
def api_settings(database_url: str, redis_url: str, namespace: str, tmp_path: Path,
                 template_dir: Path) -> ApiSettings:
    return ApiSettings(
        kafka_bootstrap_servers=os.getenv("KAFKA_BOOTSTRAP_SERVERS", DEAD_KAFKA),
        redis_url=redis_url, namespace=namespace, cluster_id="c1",
        state_dir=str(tmp_path / "state"), database_url=database_url,
        tokens=SecretStr(token_setting()), template_dir=str(template_dir), publish_timeout_s=20.0,
    )


async def start(settings: ApiSettings, clock: Clock = now_utc,
                source: tuple[str, int] = ("127.0.0.1", 123)) -> AsyncIterator[Api]:
    """The API in this loop; `source` is the address its requests come from."""
    app = create_api(settings, clock)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=source)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield Api(client, app.state.runtime, settings)
        await clean_redis(app.state.runtime)


async def clean_redis(rt: Runtime) -> None:
    """Delete the test namespace's keys (a fresh namespace per test; none may linger)."""
    stale = [k async for k in rt.redis.scan_iter(match=f"{rt.keys.prefix}*", count=1000)]
    if stale:
        await rt.redis.delete(*stale)


@pytest.fixture
async def api(api_settings: ApiSettings) -> AsyncIterator[Api]:
    async for running in start(api_settings):
        yield running


async def read_events(bootstrap: str, namespace: str, topic: Topic, count: int,
                      timeout_s: float = 20.0) -> list[bytes]:
    """The first `count` messages of a namespaced topic (from the earliest offset)."""
    consumer = AIOKafkaConsumer(topic_name(topic, namespace), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    found: list[bytes] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(found) < count:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    found += [r.value or b"" for r in records]
    finally:
        await consumer.stop()
    return found
