"""The health server's HTTP (pure): a request's head in, the route it asks for; an answer in,
the bytes to send. Only what a probe needs: GET or HEAD of `/livez` or `/readyz`, one request
per connection, no body ever read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus
from typing import Final

from common.health.policy import Answer

# The request line and headers together; a probe's are a few hundred bytes.
MAX_HEAD_BYTES: Final = 4096
END_OF_HEAD: Final = b"\r\n\r\n"
METHODS: Final = frozenset({"GET", "HEAD"})


class Endpoint(StrEnum):
    LIVEZ = "/livez"
    READYZ = "/readyz"


PATHS: Final = frozenset(e.value for e in Endpoint)


@dataclass(frozen=True)
class Route:
    """The endpoint a request asks for, or the refusal it gets at once; `head_only`: HEAD,
    the answer without its body."""

    target: Endpoint | Answer
    head_only: bool = False


def refusal(status: HTTPStatus, reason: str) -> Answer:
    return Answer(int(status), {"status": "refused", "reason": reason})


BAD_REQUEST: Final = Route(refusal(HTTPStatus.BAD_REQUEST, "malformed request line"))
TOO_LARGE: Final = refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                           f"request head over {MAX_HEAD_BYTES} bytes")
TOO_SLOW: Final = refusal(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time")


def route(head: bytes) -> Route:
    """Where a request's head (request line and headers) goes. A method other than GET or
    HEAD is refused whatever the path (405), an unknown path is 404; the query is ignored."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return BAD_REQUEST
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return BAD_REQUEST
    if not method.isalpha() or not target.startswith("/"):
        return BAD_REQUEST
    if method not in METHODS:
        return Route(refusal(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD"))
    path = target.split("?", 1)[0]
    head_only = method == "HEAD"
    if path not in PATHS:
        return Route(refusal(HTTPStatus.NOT_FOUND, "no such endpoint"), head_only)
    return Route(Endpoint(path), head_only)


def render(answer: Answer, *, head_only: bool = False) -> bytes:
    """The whole response: status line, headers, and (unless HEAD) the JSON body."""
    body = json.dumps(answer.body, separators=(",", ":")).encode()
    status = HTTPStatus(answer.status)
    lines = [f"HTTP/1.1 {status.value} {status.phrase}",
             "Content-Type: application/json",
             f"Content-Length: {len(body)}",
             "Cache-Control: no-store",
             "Connection: close"]
    if status is HTTPStatus.METHOD_NOT_ALLOWED:
        lines.append("Allow: GET, HEAD")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + body
