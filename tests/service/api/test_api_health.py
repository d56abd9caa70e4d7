"""The API's health endpoints against its real store and redis-server: /livez (and /healthz,
its first name) without a token, /readyz asking the store and Redis, 503 naming Redis when
the API's Redis does not answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.app import create_api
from services.api.settings import ApiSettings
from tests.ports import free_port
from tests.service.api.conftest import Api


async def test_livez_and_healthz_need_no_token(api: Api) -> None:
    for path in ("/livez", "/healthz"):
        answer = await api.get(path, role=None)
        assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), path
    assert (await api.client.head("/livez")).status_code == 200


async def test_readyz_asks_the_store_and_redis(api: Api) -> None:
    answer = await api.get("/readyz", role=None)
    assert answer.status_code == 200
    assert answer.json() == {"status": "ready", "checks": {"database": "ok", "redis": "ok"}}


@pytest.fixture
async def api_without_redis(api_settings: ApiSettings) -> AsyncIterator[Api]:
    # Nothing listens there: the API starts (it reaches Redis only when asked) but every
    # Redis call fails. Its keys need no cleaning: none could be written.
    settings = api_settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    app = create_api(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield Api(client, app.state.runtime, settings)


async def test_readyz_is_503_naming_redis_while_redis_does_not_answer(
        api_without_redis: Api) -> None:
    answer = await api_without_redis.get("/readyz", role=None)
    assert answer.status_code == 503
    body = answer.json()
    assert body["failed"] == ["redis"]
    assert body["checks"]["database"] == "ok"
    assert (await api_without_redis.get("/livez", role=None)).status_code == 200
