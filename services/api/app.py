"""API wiring: `uvicorn services.api.app:create_api --factory` (or `warden api`).

At start: the store's schema is migrated, Redis is connected and the tokens are loaded (a
malformed entry stops the API with the entry named). Kafka is connected on the first control,
so reads keep working while it is down. The web console is served at `/`.

Every route is under `/api/v1` (the unversioned `/api/...` paths answer as deprecated aliases,
services/api/versions.py) but the health probes, which are the same at the root of every
service; every error is answered as problem details (services/api/problems.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from common.clock import Clock
from common.metrics import API_AUTH_REFUSALS, Instruments
from common.observability import instrument_app
from common.telemetry import Telemetry, setup_telemetry
from schemas.events.v1 import TemplateChanged, now_utc
from schemas.topics import Topic
from services.analyzer.settings import AnalyzerSettings
from services.api import problems, templates
from services.api.auth import Refusal, TokenTable, load_tokens
from services.api.cluster import ClusterReader
from services.api.deps import Runtime, audit, audit_refusal, client_detail
from services.api.forecasting import ForecastCache
from services.api.guard import RequestGuard
from services.api.publisher import Publisher
from services.api.refusals import RefusalCounter
from services.api.routes import alerts as alert_routes
from services.api.routes import audit as audit_routes
from services.api.routes import cluster, enrolment, health, maintenance, me, ml, plans, tasks
from services.api.routes import templates as template_routes
from services.api.settings import ApiSettings
from services.api.versions import API_V1, DeprecatedAliases
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, connect_redis
from services.shared.runtime import configure_logging
from services.store.db import migrate, open_store
from services.store.settings import default_database_url
from services.store.template_seed import seed_templates
from services.store.template_versions import TemplateBook

log = logging.getLogger("clusterwarden.api")
CONSOLE_DIR = Path(__file__).parent / "console"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The largest body any route takes is a template (64 KiB of YAML) in JSON.
MAX_BODY_BYTES = 256 * 1024


def database_url(settings: ApiSettings) -> str:
    return settings.database_url or default_database_url(settings.state_dir)


async def _nobody(_: TemplateChanged) -> None:
    return None


async def _runtime(settings: ApiSettings, tokens: TokenTable, telemetry: Telemetry) -> Runtime:
    """The connections, made once at start: the schema migrated, the templates seeded."""
    url = database_url(settings)
    await migrate(url)
    store = open_store(url)
    redis = connect_redis(settings.redis_url, settings.redis_connect_timeout_s,
                          settings.redis_read_timeout_s)
    keys = Keys(settings.namespace)
    publisher = Publisher(settings, telemetry, settings.publish_timeout_s)

    async def notify(event: TemplateChanged) -> None:
        await publisher.publish(Topic.OPS_TEMPLATE_CHANGES, event)

    # Telling nobody: the templaters seed the same release themselves when they start.
    await seed_templates(TemplateBook(store, _nobody),
                         templates.seed_folder(settings.template_dir), actor="api")
    return Runtime(
        settings=settings, tokens=tokens, store=store, redis=redis, keys=keys,
        reader=ClusterReader(redis, keys, SchedulerSettings()),
        analyzer=AnalyzerSettings(), publisher=publisher,
        templates=TemplateBook(store, notify),
        forecasts=ForecastCache(settings.forecast_ttl_s),
        refusals=RefusalCounter(redis, keys),
        refusal_count=Instruments(telemetry.meter("clusterwarden.api")).counter(
            API_AUTH_REFUSALS),
    )


def create_api(settings: ApiSettings | None = None, clock: Clock = now_utc) -> FastAPI:
    """The API application (settings from the environment unless given; `clock` decides
    tokens' expiry and the windows of refused authentications)."""
    settings = settings or ApiSettings()
    configure_logging()
    # Read here, not at the first request: a bad token entry stops the API at start.
    tokens = load_tokens(settings.tokens.get_secret_value(), settings.tokens_file)
    if not len(tokens):
        log.warning("no API tokens configured (API_TOKENS, API_TOKENS_FILE): every call but "
                    "/healthz will be refused; `warden api token` makes one")
    telemetry = setup_telemetry("api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = await _runtime(settings, tokens, telemetry)
        app.state.runtime = rt
        try:
            yield
        finally:
            await rt.publisher.close()
            await rt.redis.aclose()
            await rt.store.close()

    app = FastAPI(
        title="ClusterWarden API",
        version="1",
        description="Ops tasks and their records, interventions, templates, nodes, breakers, "
                    "budgets, capacity and the audit log; ML tasks and the models that run "
                    "them. Bearer tokens; roles node (enrolment only) < viewer < operator < admin.",
        lifespan=lifespan,
    )

    async def refused(scope: Scope, refusal: Refusal, now: datetime) -> None:
        await audit_refusal(app.state.runtime, Request(scope), refusal, now)

    app.add_middleware(RequestGuard, tokens=tokens, clock=clock, on_refusal=refused,
                       max_body_bytes=MAX_BODY_BYTES)
    # Added last, so it runs first: the guard decides on the path the routes will match.
    app.add_middleware(DeprecatedAliases)
    app.exception_handler(StarletteHTTPException)(problems.http_problem)
    app.exception_handler(problems.ApiProblem)(problems.raised_problem)
    app.exception_handler(Exception)(problems.unhandled_problem)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # A refused change is audited like an accepted one (input-validation failures).
        if request.method in MUTATING and hasattr(request.app.state, "runtime"):
            principal = getattr(request.state, "principal", None)
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            await audit(request.app.state.runtime, principal, "invalid_request",
                        request.url.path, "request refused by validation", "422",
                        client_detail(request) | {"fields": fields})
        return problems.invalid_request(request, exc)

    for routes in (tasks, template_routes, cluster, enrolment, plans, audit_routes, me, ml,
                   alert_routes, maintenance):
        app.include_router(routes.router, prefix=API_V1, responses=problems.PROBLEM_RESPONSES)
    app.include_router(health.router)
    # Replacing the method is how FastAPI lets the document be changed; mypy forbids it.
    app.openapi = problems.with_problem_media_type(app.openapi)  # type: ignore[method-assign]
    # Last: the console takes every path no API route matched.
    console = Path(settings.console_dir) if settings.console_dir else CONSOLE_DIR
    app.mount("/", StaticFiles(directory=console, html=True), name="console")
    instrument_app(app)
    return app


def serve(settings: ApiSettings | None = None) -> None:
    """Run the API with uvicorn until interrupted."""
    import uvicorn

    settings = settings or ApiSettings()
    uvicorn.run("services.api.app:create_api", factory=True, host=settings.host,
                port=settings.port, proxy_headers=False, log_level="info")
