"""The containers' healthcheck command: the port it asks, and its exit code for an answer of
200, of 503, and for no answer at all."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from common.health import probe


class Answers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/livez" else 503)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    http = HTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield http.server_address[1]
    finally:
        http.shutdown()
        http.server_close()


def test_the_health_port_comes_first_then_the_apis() -> None:
    assert probe.port_from_env({"WARDEN_HEALTH_PORT": "8081", "API_PORT": "18080"}) == 8081
    assert probe.port_from_env({"WARDEN_HEALTH_PORT": "0", "API_PORT": "18080"}) == 18080
    with pytest.raises(SystemExit):
        probe.port_from_env({"WARDEN_HEALTH_PORT": "0"})


def test_the_exit_code_follows_the_answer(server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_HEALTH_PORT", str(server))
    assert probe.main(["livez"]) == 0
    assert probe.main(["readyz"]) == 1
    with pytest.raises(SystemExit):
        probe.main(["metrics"])


def test_no_answer_is_unhealthy(server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_HEALTH_PORT", "1")  # nothing listens on port 1
    assert probe.main(["livez"]) == 1
