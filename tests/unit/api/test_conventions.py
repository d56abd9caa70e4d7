"""The API's conventions on their own (pure ASGI: stub apps, messages made by the test): the
deprecated aliases of `/api/v1` in front of the door, and problem details' shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from starlette.types import Message, Receive, Scope, Send

from services.api.auth import Refusal, load_tokens
from services.api.guard import RequestGuard
from services.api.problems import KINDS, TYPE_BASE, problem_body
from services.api.versions import DeprecatedAliases, successor

NOW = datetime(2026, 12, 2, 13, 56, tzinfo=UTC)
TOKEN = "s3cret-token-0123456789"


@dataclass
class Seen:
    """The innermost app: records the path it was asked for, answers 200."""

    paths: list[str] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def nothing_refused(scope: Scope, refusal: Refusal, now: datetime) -> None:
    return None


async def call(path: str, root_path: str = "", token: bool = True,
               ) -> tuple[Seen, list[Message]]:
    """A request through the aliases and the door, as the app stacks them."""
    seen, sent = Seen(), []
    guard = RequestGuard(seen, tokens=load_tokens(f"{TOKEN}:ada:admin"), clock=lambda: NOW,
                         on_refusal=nothing_refused, max_body_bytes=1024)
    headers = [(b"authorization", f"Bearer {TOKEN}".encode())] if token else []
    scope = {"type": "http", "method": "GET", "path": path, "root_path": root_path,
             "headers": headers}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await DeprecatedAliases(guard)(scope, receive, send)
    return seen, sent


def headers_of(sent: list[Message]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in sent[0]["headers"]}


@pytest.mark.parametrize(("path", "versioned"), [
    ("/api/tasks", "/api/v1/tasks"),
    ("/api/tasks/7/pause", "/api/v1/tasks/7/pause"),
    ("/api", "/api/v1"),
    ("/api/v1", None),
    ("/api/v1/tasks", None),
    ("/api/v10/tasks", "/api/v1/v10/tasks"),  # not v1: an old path, which no route has
    ("/apidocs", None),
    ("/healthz", None),
    ("/", None),
])
def test_only_unversioned_api_paths_have_a_successor(path: str, versioned: str | None) -> None:
    assert successor(path) == versioned


async def test_an_alias_reaches_the_v1_route_with_deprecation_headers() -> None:
    seen, sent = await call("/api/tasks")
    assert seen.paths == ["/api/v1/tasks"]
    headers = headers_of(sent)
    assert headers["deprecation"] == "true"
    assert headers["link"] == '</api/v1/tasks>; rel="successor-version"'


async def test_a_v1_path_and_a_console_path_pass_unchanged() -> None:
    for path in ("/api/v1/tasks", "/index.html"):
        seen, sent = await call(path)
        assert seen.paths == [path]
        assert "deprecation" not in headers_of(sent)


async def test_an_alias_without_a_token_is_refused_by_the_door() -> None:
    seen, sent = await call("/api/tasks", token=False)
    assert (seen.paths, sent[0]["status"]) == ([], 401)
    assert headers_of(sent)["deprecation"] == "true"
    body = json.loads(sent[1]["body"])
    assert (body["type"], body["instance"], body["reason"]) == (
        TYPE_BASE + "unauthenticated", "/api/v1/tasks", "no_token")


async def test_behind_a_root_path_the_alias_keeps_the_root_and_still_needs_a_token() -> None:
    seen, sent = await call("/cw/api/tasks", root_path="/cw")
    assert seen.paths == ["/cw/api/v1/tasks"]
    assert headers_of(sent)["link"] == '</cw/api/v1/tasks>; rel="successor-version"'
    seen, sent = await call("/cw/api/tasks", root_path="/cw", token=False)
    assert (seen.paths, sent[0]["status"]) == ([], 401)
    # Only the root path is taken off: `/cw/api` without that root is a console path.
    seen, _ = await call("/cw/api/tasks", token=False)
    assert seen.paths == ["/cw/api/tasks"]


def test_a_problem_has_its_kind_or_about_blank_and_keeps_its_extensions() -> None:
    assert problem_body(404, "no task 7", "/api/v1/tasks/7") == {
        "type": TYPE_BASE + "not-found", "title": "No such resource", "status": 404,
        "detail": "no task 7", "instance": "/api/v1/tasks/7"}
    # A status with no kind of its own: about:blank, titled with the status's phrase.
    blank = problem_body(405, "Method Not Allowed", "/api/v1/tasks", allow="GET")
    assert (blank["type"], blank["title"], blank["allow"]) == (
        "about:blank", "Method Not Allowed", "GET")
    with pytest.raises(ValueError, match="may not redefine"):
        problem_body(401, "no", "/api", title="ok")


def test_every_kind_has_its_own_slug_and_title() -> None:
    assert len({k.slug for k in KINDS}) == len({k.title for k in KINDS}) == len(KINDS)


def test_every_kind_is_documented() -> None:
    documented = (Path(__file__).parents[3] / "docs" / "api.md").read_text()
    for kind in KINDS:
        assert f"| `{kind.slug}` |" in documented, kind
