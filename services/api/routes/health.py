"""The API's health endpoints (no token needed), the same answers as every service's
(common/health): `/livez` while the process answers, `/readyz` while the task store
and Redis answer too; `/healthz`, the first of them, stays as `/livez`'s other name."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from common.health import checks
from common.health.policy import Answer, Phase, liveness, readiness
from services.api.deps import Runtime

router = APIRouter(tags=["health"])


def _json(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status,
                        headers={"Cache-Control": "no-store"})


async def livez() -> JSONResponse:
    # The API runs no loops of its own: answering at all is its liveness.
    return _json(liveness(Phase.RUNNING, []))


async def readyz(request: Request) -> JSONResponse:
    rt: Runtime | None = getattr(request.app.state, "runtime", None)
    if rt is None:  # the lifespan has not made the connections yet
        return _json(readiness(Phase.STARTING, []))
    return _json(await checks.answer_readiness(
        Phase.RUNNING, [checks.database(rt.store.engine), checks.redis(rt.redis)],
        rt.settings.health_check_timeout_s))


# GET in the OpenAPI document; HEAD too (a probe may send it), left out of the document, where
# it would repeat GET's operation.
for path, endpoint, summary in (
        ("/livez", livez, "Liveness (no token needed)"),
        ("/healthz", livez, "Liveness, /livez's first name (no token needed)"),
        ("/readyz", readyz, "Readiness: the task store and Redis answer (no token needed)")):
    router.get(path, summary=summary)(endpoint)
    router.head(path, include_in_schema=False)(endpoint)
