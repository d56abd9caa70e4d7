"""An agent enrols itself at start-up with its bootstrap token, against the real API (served
by uvicorn), its store and Redis: it keeps the key it is handed, uses a key it already has,
waits for an API that is still starting, and stops on a refusal."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agent.enrolment import EnrolmentRefused, enrol_if_needed
from agent.settings import AgentSettings
from common.reportauth import enrol_key, ensure_master, master_path, read_node_key
from services.api.app import create_api
from services.api.settings import ApiSettings
from tests.service.api.conftest import TOKENS, Server


def agent_settings(tmp_path: Path, api_url: str, node: str = "node-021",
                   token: str = TOKENS["node"]) -> AgentSettings:
    token_file = tmp_path / "bootstrap.token"
    token_file.write_text(token + "\n")
    return AgentSettings(node_id=node, cluster_id="c1", state_dir=str(tmp_path / "agent"),
                         report_key_file=tmp_path / f"{node}.report.key",
                         bootstrap_token_file=token_file, api_url=api_url)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_agent_enrols_itself_once_and_keeps_its_key(
        api_settings: ApiSettings, tmp_path: Path) -> None:
    with Server(create_api(api_settings)) as server:
        settings = agent_settings(tmp_path, server.url)
        key = await enrol_if_needed(settings)
        assert key is not None
        assert settings.report_key_file is not None
        assert read_node_key(settings.report_key_file) == key
        master = ensure_master(master_path(api_settings.report_master_key,
                                           api_settings.state_dir))
        assert key == enrol_key(master, "c1", "node-021")
        # Restarted with its key on disk, it asks nothing (a second ask would be refused).
        assert await enrol_if_needed(settings) is None
        # Without its key, the bootstrap token cannot enrol the node again.
        settings.report_key_file.unlink()
        with pytest.raises(EnrolmentRefused, match="409"):
            await enrol_if_needed(settings)


async def test_an_unknown_token_is_a_refusal_not_a_wait(
        api_settings: ApiSettings, tmp_path: Path) -> None:
    with Server(create_api(api_settings)) as server:
        settings = agent_settings(tmp_path, server.url, token="not-a-token-0123456789")
        with pytest.raises(EnrolmentRefused, match="401"):
            await enrol_if_needed(settings)
        assert settings.report_key_file is not None
        assert not settings.report_key_file.exists()


async def test_an_agent_waits_for_an_api_that_is_still_starting(
        api_settings: ApiSettings, tmp_path: Path) -> None:
    port = free_port()
    settings = agent_settings(tmp_path, f"http://127.0.0.1:{port}")
    enrolling = asyncio.create_task(enrol_if_needed(settings, pause_s=0.2))
    await asyncio.sleep(1.0)  # refused connections meanwhile
    assert not enrolling.done()
    server = Server(create_api(api_settings))
    server.server.config.port = port
    with server:
        key = await asyncio.wait_for(enrolling, 20)
    assert key is not None
    assert key.node_id == "node-021"
