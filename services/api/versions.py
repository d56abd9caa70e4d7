"""The API's versions: every route lives under `/api/v1`; the unversioned `/api/...` paths of
the previous release still answer, as deprecated aliases, for one more release.

An alias is rewritten to its `/api/v1` path before anything else sees the request, so the
token check (services/api/guard.py), the routes, the audit log and the OpenAPI document know
one path per route. Its answer says it is deprecated and names the path to use instead
(`Deprecation: true`, `Link: </api/v1/...>; rel="successor-version"`), errors included.
"""

from __future__ import annotations

from typing import Final

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.guard import TOKEN_PREFIX, route_path

API_V1: Final = f"{TOKEN_PREFIX}/v1"


def is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(f"{prefix}/")


def successor(path: str) -> str | None:
    """The `/api/v1` path an unversioned `/api/...` path stands for; None for any other."""
    if not is_under(path, TOKEN_PREFIX) or is_under(path, API_V1):
        return None
    return API_V1 + path[len(TOKEN_PREFIX):]


class DeprecatedAliases:
    """Pure ASGI middleware: `/api/x` is answered as `/api/v1/x`, with deprecation headers.

    Added outside the guard, which then decides on the path the routes match.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_path(scope)
        versioned = successor(route)
        if versioned is None:
            await self.app(scope, receive, send)
            return
        # Behind a server's root path, the route path is what follows it: the root is kept.
        path: str = scope["path"]
        root = path[:len(path) - len(route)]
        link = f'<{root}{versioned}>; rel="successor-version"'

        async def send_deprecated(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Deprecation"] = "true"
                headers.append("Link", link)
            await send(message)

        # In place, not in a copy: the server-error handler, outside every middleware, reads
        # this scope too, and must name the same path as every other answer.
        scope["path"] = root + versioned
        await self.app(scope, receive, send_deprecated)
