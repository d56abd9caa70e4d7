"""The API's door on its own (pure ASGI: a stub app, messages made by the test)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from starlette.types import Message, Receive, Scope, Send

from services.api.auth import Principal, Refusal, load_tokens
from services.api.guard import RequestGuard

TOKEN = "s3cret-token-0123456789"
NOW = datetime(2026, 12, 2, 13, 56, tzinfo=UTC)
LIMIT = 256 * 1024
CHUNK = 64 * 1024


@dataclass
class Body:
    """A request body of `total` bytes that arrives in chunks; counts what was taken."""

    total: int
    taken: int = 0

    async def receive(self) -> Message:
        size = min(CHUNK, self.total - self.taken)
        self.taken += size
        return {"type": "http.request", "body": b"x" * size,
                "more_body": self.taken < self.total}


@dataclass
class Reply:
    messages: list[Message] = field(default_factory=list)

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


@dataclass
class ReadingApp:
    """Reads the whole body, as a route that takes one does, then answers 200."""

    seen: int = 0
    principal: object = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.principal = scope.get("state", {}).get("principal")
        try:
            while True:
                message = await receive()
                self.seen += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
        except Exception:
            # As the framework does with a body it cannot read: a 400 of its own.
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"bad body"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class Refusals:
    seen: list[Refusal] = field(default_factory=list)

    async def __call__(self, scope: Scope, refusal: Refusal, now: datetime) -> None:
        self.seen.append(refusal)


def scope(path: str, headers: dict[str, str], root_path: str = "") -> Scope:
    return {"type": "http", "method": "POST", "path": path, "root_path": root_path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


async def call(path: str, headers: dict[str, str], body: Body,
               root_path: str = "") -> tuple[Reply, ReadingApp, Refusals]:
    app, refusals, reply = ReadingApp(), Refusals(), Reply()
    guard = RequestGuard(app, tokens=load_tokens(f"{TOKEN}:ada:admin"), clock=lambda: NOW,
                         on_refusal=refusals, max_body_bytes=LIMIT)
    await guard(scope(path, headers, root_path), body.receive, reply.send)
    return reply, app, refusals


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_chunked_body_past_the_limit_is_413_and_never_taken_further() -> None:
    body = Body(8 * 1024 * 1024)
    reply, app, _ = await call("/api/tasks", BEARER, body)
    assert reply.status == 413
    assert [m["status"] for m in reply.messages if m["type"] == "http.response.start"] == [413]
    assert app.seen <= LIMIT
    assert body.taken <= LIMIT + CHUNK


async def test_a_body_within_the_limit_reaches_the_app_with_the_principal() -> None:
    reply, app, _ = await call("/api/tasks", BEARER, Body(LIMIT))
    assert reply.status == 200
    assert app.seen == LIMIT
    assert app.principal == Principal("ada", "admin")


async def test_a_declared_length_past_the_limit_is_413_before_any_body() -> None:
    body = Body(8 * 1024 * 1024)
    reply, _, _ = await call("/api/tasks", BEARER | {"Content-Length": str(LIMIT + 1)}, body)
    assert reply.status == 413
    assert body.taken == 0


@pytest.mark.parametrize(("headers", "reason"), [
    ({}, "no_token"),
    ({"Authorization": "Bearer guessed-token-0123456789"}, "unknown_token"),
    ({"Authorization": f"Basic {TOKEN}"}, "no_token"),
])
async def test_without_a_valid_token_an_api_route_is_401_before_any_body(
        headers: dict[str, str], reason: str) -> None:
    body = Body(8 * 1024 * 1024)
    reply, app, refusals = await call("/api/tasks", headers, body)
    assert reply.status == 401
    assert body.taken == 0
    assert app.seen == 0
    assert [r.reason for r in refusals.seen] == [reason]


async def test_token_free_routes_pass_without_a_token_and_keep_the_body_limit() -> None:
    reply, app, refusals = await call("/healthz", {}, Body(10))
    assert (reply.status, app.seen, refusals.seen) == (200, 10, [])
    body = Body(8 * 1024 * 1024)
    reply, _, _ = await call("/index.html", {}, body)
    assert reply.status == 413
    assert body.taken <= LIMIT + CHUNK
    # Only `/api` and what is under it: a console path that merely starts so is free.
    reply, _, refusals = await call("/apidocs", {}, Body(0))
    assert (reply.status, refusals.seen) == (200, [])


async def test_a_refusal_before_the_body_is_read_closes_the_connection() -> None:
    reply, _, _ = await call("/api/tasks", {"Transfer-Encoding": "chunked"}, Body(10))
    assert (b"connection", b"close") in reply.messages[0]["headers"]
    reply, _, _ = await call("/api/tasks", BEARER, Body(LIMIT + 1))
    assert (b"connection", b"close") in reply.messages[0]["headers"]
    # Nothing left unread: the connection may be kept.
    reply, _, _ = await call("/api/tasks", {}, Body(0))
    assert (b"connection", b"close") not in reply.messages[0]["headers"]


async def test_behind_a_root_path_the_api_routes_still_need_a_token() -> None:
    reply, _, _ = await call("/cw/api/tasks", {}, Body(0), root_path="/cw")
    assert reply.status == 401
    reply, _, _ = await call("/cw/healthz", {}, Body(0), root_path="/cw")
    assert reply.status == 200
