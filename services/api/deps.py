"""What every route needs: the runtime (store, Redis, publisher), the caller, the audit log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis

from schemas.envelope import reason_text, short_text
from services.analyzer.settings import AnalyzerSettings
from services.api.auth import Principal, Role, TokenTable
from services.api.cluster import ClusterReader
from services.api.forecasting import ForecastCache
from services.api.publisher import Publisher
from services.api.settings import ApiSettings
from services.shared.redis_client import Keys
from services.store.db import Store
from services.store.queries import append_audit
from services.store.template_versions import TemplateBook

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


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits callers with `role` or a higher one (401/403, audited)."""

    async def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Principal:
        rt = runtime(request)
        principal = rt.tokens.authenticate(credentials.credentials) if credentials else None
        if principal is None:
            await audit(rt, None, "authenticate", request.url.path,
                        "no bearer token" if credentials is None else "unknown bearer token",
                        "401", client_detail(request))
            raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                                "a valid bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})
        # Kept for the validation-error handler, which audits refused mutating calls.
        request.state.principal = principal
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
