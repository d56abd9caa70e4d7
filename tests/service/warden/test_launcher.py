"""The API as a service process: started by the launcher like the others, stopped by it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.service.api.conftest import TOKENS, token_setting
from warden import launcher


def test_the_launcher_runs_the_api_with_uvicorn(tmp_path: Path, redis_url: str,
                                                namespace: str) -> None:
    assert launcher.API in launcher.PROCESSES
    assert launcher.API not in launcher.SERVICES  # tests naming services get no API
    port = free_port()
    env = {"REDIS_URL": redis_url, "WARDEN_NAMESPACE": namespace, "API_PORT": str(port),
           "API_TOKENS": token_setting(), "WARDEN_STATE_DIR": str(tmp_path),
           "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}"}
    [api] = launcher.start_services(tmp_path, env, (launcher.API,))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert api.process.poll() is None, api.log_path.read_text()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, api.log_path.read_text()
                time.sleep(0.2)
        assert health.json() == {"status": "ok"}
        tasks = httpx.get(f"http://127.0.0.1:{port}/api/tasks",
                          headers={"Authorization": f"Bearer {TOKENS['viewer']}"})
        assert tasks.json()["total"] == 0
        # The built-in templates seeded into the store the API and the templater share.
        listed = httpx.get(f"http://127.0.0.1:{port}/api/templates",
                           headers={"Authorization": f"Bearer {TOKENS['viewer']}"}).json()
        assert {(t["name"], t["version"], t["origin"]) for t in listed} >= {
            ("offline", 1, "builtin"), ("scale_out", 1, "builtin")}
    finally:
        launcher.stop_services([api])
    # Graceful: uvicorn finishes the lifespan, then dies of the SIGTERM it re-raises.
    assert "Application shutdown complete" in api.log_path.read_text()
