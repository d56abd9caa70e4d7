"""What every route needs: the runtime (store, Redis, publisher), the caller, the audit log."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis
from redis.exceptions import RedisError

from common.metrics import Counter
from schemas.envelope import reason_text, short_text
from services.analyzer.settings import AnalyzerSettings
from services.api.auth import Principal, Refusal, Role, TokenTable
from services.api.cluster import ClusterReader
from services.api.forecasting import ForecastCache
from services.api.publisher import Publisher
from services.api.refusals import MAX_AUDITED_PAIRS, RefusalCounter, window_of
from services.api.settings import ApiSettings
from services.shared.redis_client import Keys
from services.store.db import Store
from services.store.queries import append_audit
from services.store.template_versions import TemplateBook

log = logging.getLogger("clusterwarden.api")

# Who an audit entry names when the caller could not be identified.
ANONYMOUS = "anonymous"

bearer = HTTPBearer(auto_error=False, description="A token from `warden api token`.")


@dataclass
class Runtime:
    """The API's connections and configuration, made once per process in the lifespan."""

    settings: ApiSettings
    tokens: TokenTable
    store: Store
    redis: Redis
    keys: Keys
    reader: ClusterReader
    analyzer: AnalyzerSettings
    publisher: Publisher
    templates: TemplateBook
    forecasts: ForecastCache
    refusals: RefusalCounter
    refusal_count: Counter


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(runtime)]


def client_detail(request: Request) -> dict[str, Any]:
    """Where a request came from, for the audit entry (never its token)."""
    return {
        "method": request.method,
        "path": request.url.path,
        "ip": request.client.host if request.client else None,
    }


async def audit(rt: Runtime, principal: Principal | None, action: str, target: str,
                reason: str, result: str, detail: dict[str, Any]) -> None:
    """Append one entry to the store's hash-chained audit log (committed before returning)."""
    async with rt.store.session() as session:
        await append_audit(
            session, actor=principal.user if principal else ANONYMOUS,
            role=principal.role if principal else "none", action=action,
            target=short_text(target), reason=reason_text(reason), result=short_text(result),
            detail=detail,
        )


async def audit_refusal(rt: Runtime, request: Request, refusal: Refusal,
                        now: datetime) -> None:
    """Count a refused authentication; audit it if it is its source's first for its reason in
    the window (services/api/refusals.py), or the one that reaches the window's cap."""
    detail = client_detail(request)
    source = detail["ip"] or "unknown"
    window = window_of(now, rt.refusals.window_s)
    rt.refusal_count.add(1, {"reason": refusal.reason})
    try:
        decision = await rt.refusals.count(window, source, refusal)
    except RedisError as err:
        # Not audited one by one instead: that is the flood the count exists to stop.
        log.warning("refused authentication from %s (%s) not counted: Redis: %s", source,
                    refusal.reason, err)
        return
    until = (window.start + timedelta(seconds=rt.refusals.window_s)).isoformat()
    aggregate = {"refusal": refusal.reason, "window_start": window.start.isoformat(),
                 "window_s": rt.refusals.window_s}
    if decision == "audit":
        await audit(rt, None, "authenticate", request.url.path,
                    f"{refusal.text}; later ones from {source} for the same reason until "
                    f"{until} are counted, not audited", "401", detail | aggregate)
    elif decision == "audit_cap":
        log.warning("refused authentications from more than %d sources in the window from %s",
                    MAX_AUDITED_PAIRS, window.start.isoformat())
        await audit(rt, None, "authenticate", "*",
                    f"more than {MAX_AUDITED_PAIRS} sources refused since "
                    f"{window.start.isoformat()}: the others until {until} are counted, not "
                    "audited", "401", aggregate)


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits callers with `role` or a higher one (403, audited).

    The token was checked before the body was read (services/api/guard.py), which left the
    principal in the request's state; `credentials` is declared only so that the OpenAPI
    document names the bearer scheme.
    """

    async def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Principal:
        rt = runtime(request)
        principal = getattr(request.state, "principal", None)
        if not isinstance(principal, Principal):  # a route outside the guard's /api prefix
            raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                                "a valid bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})
        if not principal.allows(role):
            await audit(rt, principal, "authorize", request.url.path,
                        f"needs role {role}, has {principal.role}", "403",
                        client_detail(request))
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"this needs the {role} role; {principal.user} is "
                                f"{principal.role}")
        return principal

    return dependency


Viewer = Annotated[Principal, Depends(require("viewer"))]
Operator = Annotated[Principal, Depends(require("operator"))]
Admin = Annotated[Principal, Depends(require("admin"))]
