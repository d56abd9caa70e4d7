"""The CLI against the real API (in process), its store and Redis: the `warden` fixture."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from schemas.events.v1 import TaskEvent
from services.api.app import create_api
from services.api.auth import Role
from services.api.client import ApiClient, ClientSettings
from services.api.deps import Runtime
from services.api.settings import ApiSettings
from services.store.recorder import Recorder

# The API's fixtures (api_settings, template_dir): the commands run against that API.
from tests.service.api.conftest import (  # noqa: F401
    TOKENS,
    api_settings,
    clean_redis,
    template_dir,
)
from warden.cli import app, common


class Server:
    """The API under uvicorn on a free port, in a thread with its own event loop."""

    def __init__(self, app: FastAPI) -> None:
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


@dataclass
class Cli:
    server: Server
    runtime: Runtime
    role: Role | None = "admin"
    runner: CliRunner = field(default_factory=CliRunner)

    def run(self, *args: str, role: Role | None = None) -> Result:
        if role is not None:
            self.role = role
        return self.runner.invoke(app, list(args))

    def record(self, events: list[TaskEvent]) -> None:
        async def record() -> None:
            recorder = Recorder(self.runtime.store)
            for event in events:
                await recorder.record(event)

        self.server.call(record)


@contextmanager
def cli_of(settings: ApiSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """The CLI, its API client pointed at a real API served with `settings`."""
    api = create_api(settings)
    with Server(api) as server:
        running = Cli(server, api.state.runtime)

        def client() -> ApiClient:
            token = TOKENS[running.role] if running.role else ""
            return ApiClient(ClientSettings(url=server.url, token=SecretStr(token)))

        monkeypatch.setattr(common, "api_client", client)
        yield running
        server.call(clean_redis, running.runtime)


@pytest.fixture
def warden(api_settings: ApiSettings,  # noqa: F811  (the fixture)
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    with cli_of(api_settings, monkeypatch) as running:
        yield running
