"""The API's door against hostile clients, under uvicorn on a real socket: an 8 MiB chunked
body (no Content-Length) is refused with 413 or 401 at once, and the API never takes more of
it than its limit; a flood of bad tokens adds a bounded number of audit entries."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from services.api.app import MAX_BODY_BYTES, create_api
from services.api.deps import Viewer
from services.api.refusals import MAX_AUDITED_PAIRS, WINDOW_S
from services.api.settings import ApiSettings
from tests.service.api.conftest import TOKENS, Api, Server, auth, clean_redis, start

EIGHT_MIB = 8 * 1024 * 1024
CHUNK = 64 * 1024
SINK = "/api/v1/test-sink"


@dataclass
class Intake:
    """Wraps the API: counts the body bytes the server hands to it."""

    app: FastAPI
    received: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received[path] = self.received.get(path, 0) + len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


@dataclass
class Sink:
    """A route that reads whatever body it is given: what the routes behind the door see."""

    seen: int = 0

    async def __call__(self, request: Request, _: Viewer) -> dict[str, int]:
        async for chunk in request.stream():
            self.seen += len(chunk)
        return {"seen": self.seen}


@dataclass
class Served:
    server: Server
    intake: Intake
    sink: Sink

    @property
    def port(self) -> int:
        return int(self.server.url.rsplit(":", 1)[1])


@pytest.fixture
def served(api_settings: ApiSettings) -> Iterator[Served]:
    app = create_api(api_settings)
    sink = Sink()
    # First, or the console's mount at `/` would take the path.
    app.router.routes.insert(0, APIRoute(SINK, sink, methods=["POST"]))
    intake = Intake(app)
    with Server(intake) as server:
        yield Served(server, intake, sink)
        server.call(clean_redis, app.state.runtime)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    seconds: float


async def chunked_post(port: int, path: str, headers: dict[str, str],
                       total: int = EIGHT_MIB) -> Answer:
    """POST `total` bytes as a chunked body (no Content-Length) while reading the answer.

    On a plain socket: a server that answers before the body ends closes the connection, and
    the reset that follows must not cost the answer the client has already received.
    """
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

    async def pump() -> None:
        await loop.sock_sendall(sock, (
            f"POST {path} HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n{head}\r\n").encode())
        chunk = f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n"
        for _ in range(total // CHUNK):
            await loop.sock_sendall(sock, chunk)
        await loop.sock_sendall(sock, b"0\r\n\r\n")

    sending = asyncio.create_task(pump())
    received = b""
    try:
        async with asyncio.timeout(10):
            while not _complete(received):
                try:
                    data = await loop.sock_recv(sock, 65_536)
                except ConnectionResetError:
                    break
                if not data:
                    break
                received += data
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        sock.close()
    status_line, _, rest = received.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return Answer(int(status_line.split()[1]), body, time.monotonic() - began)


def _complete(received: bytes) -> bool:
    """A whole answer: its headers and as many body bytes as they announce."""
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


async def test_a_chunked_body_past_the_limit_is_413_and_the_api_never_holds_it(
        served: Served) -> None:
    answer = await chunked_post(served.port, SINK, auth("viewer"))
    assert answer.status == 413, answer.body
    assert answer.seconds < 5
    # The route saw at most the limit; the server handed the API at most one read more.
    assert served.sink.seen <= MAX_BODY_BYTES
    assert served.intake.received[SINK] <= 2 * MAX_BODY_BYTES
    # A real route that takes a body, the same.
    path = "/api/breakers/reset"
    answer = await chunked_post(served.port, path, auth("admin"))
    assert answer.status == 413, answer.body
    assert served.intake.received[path] <= 2 * MAX_BODY_BYTES


async def test_a_chunked_body_within_the_limit_reaches_the_route(served: Served) -> None:
    answer = await chunked_post(served.port, SINK, auth("viewer"), total=4 * CHUNK)
    assert answer.status == 200, answer.body
    assert served.sink.seen == 4 * CHUNK


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer guessed-token-0123456789"}])
async def test_without_a_token_a_chunked_body_is_401_and_never_read(
        served: Served, headers: dict[str, str]) -> None:
    for path in (SINK, "/api/breakers/reset"):
        answer = await chunked_post(served.port, path, headers)
        assert answer.status == 401, answer.body
        assert answer.seconds < 5
        assert served.intake.received.get(path, 0) == 0
    assert served.sink.seen == 0


# ------------------------------------------------------------------ the audit of refusals


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 2, 13, 56, 5, tzinfo=UTC))


async def api_from(settings: ApiSettings, clock: Clock, ip: str) -> AsyncIterator[Api]:
    async for running in start(settings, clock, source=(ip, 40_000)):
        yield running


async def test_a_flood_of_bad_tokens_adds_one_entry_per_source_and_reason(
        api_settings: ApiSettings, clock: Clock) -> None:
    async for api in api_from(api_settings, clock, "203.0.113.7"):
        for i in range(1000):
            bad = {"Authorization": f"Bearer guess-{i:05d}-0123456789"} if i % 2 else {}
            response = await api.client.get("/api/tasks", headers=bad)
            assert response.status_code == 401
        entries = await api.audit()
        assert sorted((e.action, e.result, e.detail["refusal"], e.detail["ip"])
                      for e in entries) == [
            ("authenticate", "401", "no_token", "203.0.113.7"),
            ("authenticate", "401", "unknown_token", "203.0.113.7"),
        ]
        # The counts stand in Redis, expiring with the window after next.
        rt = api.runtime
        [count_key] = [k async for k in rt.redis.scan_iter(
            match=f"{rt.keys.prefix}api-refusals:*:unknown_token:203.0.113.7")]
        assert int(await rt.redis.get(count_key) or 0) == 500
        assert 0 < await rt.redis.ttl(count_key) <= 2 * WINDOW_S
        # The next window audits the source again, once.
        clock.at += timedelta(seconds=WINDOW_S)
        for _ in range(50):
            await api.client.get("/api/tasks")
        assert len(await api.audit()) == 3
        # Privileged actions stay audited one by one.
        for _ in range(5):
            assert (await api.post("/api/breakers/reset", {"reason": "r", "cluster": "c1",
                                                           "kind": "offline"},
                                   role="operator")).status_code == 403
        entries = await api.audit()
        assert [e.action for e in entries[3:]] == ["authorize"] * 5
        verified = (await api.get("/api/audit", role="admin", verify=True)).json()
        assert verified["chain"]["ok"] is True


async def test_a_flood_from_many_sources_adds_at_most_the_cap_and_one(
        api_settings: ApiSettings, clock: Clock) -> None:
    app = create_api(api_settings, clock)
    async with app.router.lifespan_context(app):
        for n in range(100):
            transport = httpx.ASGITransport(app=app, client=(f"198.51.100.{n}", 40_000))
            async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as c:
                for i in range(10):
                    bad = {"Authorization": f"Bearer g{n}-{i}-0123456789"}
                    assert (await c.get("/api/me", headers=bad)).status_code == 401
        entries = await Api(c, app.state.runtime, api_settings).audit()
        await clean_redis(app.state.runtime)
    assert len(entries) == MAX_AUDITED_PAIRS + 1
    assert entries[-1].target == "*"
    assert f"more than {MAX_AUDITED_PAIRS} sources" in entries[-1].reason


# ------------------------------------------------------------------ expiring tokens

EXPIRING = "expiring-token-0123456789"


async def test_an_expired_token_is_401_token_expired_by_the_apis_clock(
        api_settings: ApiSettings, clock: Clock) -> None:
    entry = f"{EXPIRING}:erin:operator:issued=20261202T130000Z:expires=20261202T140000Z"
    settings = api_settings.model_copy(update={
        "tokens": type(api_settings.tokens)(f"{api_settings.tokens.get_secret_value()},{entry}")})
    async for api in api_from(settings, clock, "127.0.0.1"):
        bearer = {"Authorization": f"Bearer {EXPIRING}"}
        me = await api.client.get("/api/me", headers=bearer)
        assert me.json() == {"user": "erin", "role": "operator"}
        clock.at = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
        expired = await api.client.get("/api/me", headers=bearer)
        assert expired.status_code == 401
        assert expired.json()["reason"] == "token_expired"
        assert expired.headers["WWW-Authenticate"] == "Bearer"
        # Other tokens are untouched; an unknown one is still only unknown.
        assert (await api.get("/api/me", role="admin")).status_code == 200
        unknown = await api.client.get("/api/me", headers={"Authorization": "Bearer nope"})
        assert unknown.json()["reason"] == "unknown_token"
        [refused, _] = await api.audit()
        assert (refused.action, refused.result) == ("authenticate", "401")
        assert refused.reason.startswith("expired bearer token")
        assert refused.detail["refusal"] == "token_expired"
        assert EXPIRING not in refused.model_dump_json()
        assert TOKENS["admin"] not in refused.model_dump_json()
