"""The CLI against the real API (in process), its store and Redis: the `warden` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
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
    Server,
    api_settings,
    clean_redis,
    template_dir,
)
from warden.cli import app, common


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
