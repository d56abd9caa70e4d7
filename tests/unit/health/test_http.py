"""The health server's HTTP (common/health/http.py): which requests reach an
endpoint, which are refused with what, and the bytes of an answer."""

from __future__ import annotations

import json

import pytest

from common.health.http import Endpoint, render, route
from common.health.policy import Answer


def status_of(head: bytes) -> int | Endpoint:
    target = route(head).target
    return target if isinstance(target, Endpoint) else target.status


@pytest.mark.parametrize(("head", "expected"), [
    (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", Endpoint.LIVEZ),
    (b"GET /readyz HTTP/1.1\r\nUser-Agent: kube-probe/1.34\r\n\r\n", Endpoint.READYZ),
    (b"HEAD /readyz HTTP/1.0\r\n\r\n", Endpoint.READYZ),
    (b"GET /livez?verbose=1 HTTP/1.1\r\n\r\n", Endpoint.LIVEZ),
    (b"GET /healthz HTTP/1.1\r\n\r\n", 404),
    (b"GET / HTTP/1.1\r\n\r\n", 404),
    (b"GET /livez/ HTTP/1.1\r\n\r\n", 404),
    (b"POST /livez HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 405),
    (b"DELETE /nowhere HTTP/1.1\r\n\r\n", 405),
    (b"GET /livez\r\n\r\n", 400),
    (b"GET  /livez HTTP/1.1\r\n\r\n", 400),
    (b"GET /livez SPDY/3\r\n\r\n", 400),
    (b"GET livez HTTP/1.1\r\n\r\n", 400),
    (b"G\xffT /livez HTTP/1.1\r\n\r\n", 400),
    (b"\r\n\r\n", 400),
])
def test_a_request_reaches_an_endpoint_or_is_refused(head: bytes,
                                                     expected: int | Endpoint) -> None:
    assert status_of(head) == expected


def test_head_is_marked_to_leave_the_body_out() -> None:
    assert route(b"HEAD /livez HTTP/1.1\r\n\r\n").head_only
    assert not route(b"GET /livez HTTP/1.1\r\n\r\n").head_only


def test_an_answer_is_a_complete_response_that_closes_the_connection() -> None:
    response = render(Answer(503, {"status": "unready", "failed": ["redis"]}))
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    assert "Connection: close" in lines
    assert "Content-Type: application/json" in lines
    assert f"Content-Length: {len(body)}" in lines
    assert json.loads(body) == {"status": "unready", "failed": ["redis"]}


def test_head_gets_the_headers_only_and_405_says_what_is_allowed() -> None:
    response = render(Answer(200, {"status": "ok"}), head_only=True)
    assert response.endswith(b"\r\n\r\n")
    assert b"Content-Length: 15" in response
    refused = route(b"PUT /livez HTTP/1.1\r\n\r\n").target
    assert isinstance(refused, Answer)
    assert b"Allow: GET, HEAD" in render(refused)
