"""The API's door: the bearer token and the body's size, settled before any body is read.

A request's headers are all the door reads before it decides:
- a `Content-Length` above the limit is answered 413 at once;
- a route under `/api` (`/api/v1`; its deprecated aliases reach the door rewritten to it,
  services/api/versions.py) without a valid token is answered 401 at once (the refusal is
  handed to `on_refusal`, which audits it at a bounded rate); `/healthz`, the OpenAPI pages
  and the console's static files need no token;
- the body is then passed on as it streams in, counted, and the request is answered 413 the
  moment the count passes the limit: a chunked body, which has no length to refuse, is never
  held beyond the limit either. What the app had begun to answer is dropped.

Both refusals are problem details (services/api/problems.py), the 401's `reason` among them.

The admitted principal is left in the request's state (`request.state.principal`), where the
routes' role checks (services/api/deps.py) find it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.clock import Clock
from services.api.auth import Refusal, TokenTable, bearer_token
from services.api.problems import ProblemResponse, problem_response

# Where the token-free routes end: everything under it needs a token.
TOKEN_PREFIX = "/api"

RefusalHook = Callable[[Scope, Refusal, datetime], Awaitable[None]]


class BodyTooLarge(Exception):
    """The request's body passed the limit while it was being read."""


def needs_token(path: str) -> bool:
    return path == TOKEN_PREFIX or path.startswith(f"{TOKEN_PREFIX}/")


def route_path(scope: Scope) -> str:
    """The path the routes are matched on: the request's, less a server's root path.

    Decided on anything else, a root path would let `/root/api/...` reach a route under
    `/api` as if it needed no token.
    """
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):]
    return path


def has_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")


# Answered before a body is read in full, the connection is closed: kept open, the server
# would read the rest (however long a chunked body goes on) only to throw it away.
CLOSE = {"Connection": "close"}


def too_large(scope: Scope, limit: int) -> ProblemResponse:
    return problem_response(413, f"body larger than {limit} bytes", scope["path"],
                            headers=CLOSE)


def unauthorized(scope: Scope, refusal: Refusal, unread_body: bool) -> ProblemResponse:
    challenge = {"WWW-Authenticate": "Bearer"}
    return problem_response(401, "a valid bearer token is required", scope["path"],
                            headers=challenge | (CLOSE if unread_body else {}),
                            reason=refusal.reason)


class _CountedExchange:
    """One request's body, counted as it is received, and its answer, held back once the
    count passed the limit."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.received = 0
        self.overflowed = False
        self.started = False

    async def receive(self) -> Message:
        if self.overflowed:
            raise BodyTooLarge
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.overflowed = True
                raise BodyTooLarge
        return message

    async def send(self, message: Message) -> None:
        if self.overflowed and not self.started:
            return  # the app's answer to a body it could not finish reading; 413 follows
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class RequestGuard:
    """Pure ASGI middleware: token and body limit before the app sees the body."""

    def __init__(self, app: ASGIApp, *, tokens: TokenTable, clock: Clock,
                 on_refusal: RefusalHook, max_body_bytes: int) -> None:
        self.app = app
        self.tokens = tokens
        self.clock = clock
        self.on_refusal = on_refusal
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await too_large(scope, self.max_body_bytes)(scope, receive, send)
            return
        if needs_token(route_path(scope)):
            now = self.clock()
            admitted = self.tokens.authenticate(bearer_token(headers.get("authorization")), now)
            if isinstance(admitted, Refusal):
                await self.on_refusal(scope, admitted, now)
                await unauthorized(scope, admitted, has_body(headers))(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = admitted
        exchange = _CountedExchange(receive, send, self.max_body_bytes)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except BodyTooLarge:
            if exchange.started:
                raise  # too late for a 413: the server drops the connection
        if exchange.overflowed and not exchange.started:
            await too_large(scope, self.max_body_bytes)(scope, receive, send)
