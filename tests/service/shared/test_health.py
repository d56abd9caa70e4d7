"""The health endpoints of real services against the real Kafka broker and redis-server: the
scheduler, run as the launcher runs it, is ready and alive, then not ready (naming Redis) and
still alive once its Redis is gone; a service still starting is alive and not ready; a
background loop or a consumer that ended makes a service's /livez 503; the store service's
readiness asks its database."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from faststream.kafka import KafkaBroker

from common.messaging import delete_topics, subscribe
from common.settings import ServiceSettings
from schemas.events.v1 import OpsTask
from schemas.topics import Topic
from services.shared.runtime import build_app
from services.store.app import create_app as create_store
from services.store.settings import StoreSettings
from tests.ports import free_port
from tests.waiting import eventually
from warden import launcher

# Start-up creates every topic of a fresh namespace first: seconds, on a loaded machine more.
START_S = 90.0


def health(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """The status and JSON body at `path` of the health port, or None if nothing answers."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5.0)
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


async def health_of(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    return await asyncio.to_thread(health, port, path)


async def body_if(port: int, path: str, status: int) -> dict[str, Any] | None:
    """The body at `path` if it came with `status` (for waiting until it does)."""
    answer = await health_of(port, path)
    return answer[1] if answer and answer[0] == status else None


async def test_the_scheduler_is_unready_naming_redis_once_redis_is_gone_and_stays_alive(
        kafka_bootstrap: str, namespace: str, tmp_path: Path,
        private_redis: tuple[str, subprocess.Popen[bytes]]) -> None:
    redis_url, redis_server = private_redis
    port = free_port()
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_STATE_DIR": str(tmp_path),
           "WARDEN_HEALTH_PORT": str(port)}
    [scheduler] = launcher.start_services(tmp_path, env, ("scheduler",))
    try:
        def log() -> str:
            return scheduler.log_path.read_text(errors="replace")[-3000:]

        async def ready() -> dict[str, Any] | None:
            assert scheduler.process.poll() is None, log()
            return await body_if(port, "/readyz", 200)

        body: dict[str, Any] = await eventually(
            ready, lambda: f"the scheduler ready\n{log()}", timeout_s=START_S, poll_s=0.2)
        assert body["checks"] == {"kafka": "ok", "redis": "ok"}
        assert await health_of(port, "/livez") == (200, {"status": "ok"})

        redis_server.terminate()
        redis_server.wait(10)

        body = await eventually(lambda: body_if(port, "/readyz", 503),
                                "the scheduler unready without its Redis", poll_s=0.2)
        assert body["failed"] == ["redis"]
        assert body["checks"]["kafka"] == "ok"
        assert "redis" in str(body["reason"])
        # Redis gone is no reason to restart the scheduler: it still lives.
        assert await health_of(port, "/livez") == (200, {"status": "ok"})
        assert scheduler.process.poll() is None
    finally:
        launcher.stop_services([scheduler])
        with contextlib.suppress(Exception):
            await delete_topics(kafka_bootstrap, namespace)


@contextlib.asynccontextmanager
async def running(app_factory: Any, kafka_bootstrap: str, namespace: str) -> AsyncIterator[None]:
    """An app started in this event loop, stopped and its topics deleted after."""
    app = app_factory()
    try:
        async with app:
            yield
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(kafka_bootstrap, namespace)


def settings_for(kafka_bootstrap: str, namespace: str, tmp_path: Path,
                 port: int) -> ServiceSettings:
    return ServiceSettings(kafka_bootstrap_servers=kafka_bootstrap, namespace=namespace,
                           state_dir=str(tmp_path), health_port=port)


async def test_a_service_starting_is_alive_and_not_yet_ready(
        kafka_bootstrap: str, namespace: str, tmp_path: Path) -> None:
    port = free_port()
    held = asyncio.Event()

    async def slow_starter() -> None:
        await held.wait()  # as a migration waiting for another process's lock

    app = build_app(KafkaBroker(kafka_bootstrap), settings_for(kafka_bootstrap, namespace,
                                                               tmp_path, port),
                    starters=[slow_starter])
    starting = asyncio.create_task(app.start())
    try:
        body: dict[str, Any] = await eventually(lambda: body_if(port, "/readyz", 503),
                                                "/readyz answering while start-up runs")
        assert body == {"status": "starting", "reason": "start-up not finished"}
        assert await health_of(port, "/livez") == (200, {"status": "ok"})
        held.set()
        await starting
        assert (await health_of(port, "/readyz") or (0,))[0] == 200
    finally:
        held.set()
        await starting
        await app.stop()
        with contextlib.suppress(Exception):
            await delete_topics(kafka_bootstrap, namespace)


async def test_a_background_loop_that_ends_makes_livez_503(
        kafka_bootstrap: str, namespace: str, tmp_path: Path) -> None:
    port = free_port()
    settings = settings_for(kafka_bootstrap, namespace, tmp_path, port)
    broken = asyncio.Event()

    async def steady() -> None:
        return None

    async def tick() -> None:
        if broken.is_set():
            # A cancellation meant for something else, out of a tick: the loop ends with it.
            raise asyncio.CancelledError

    def app() -> Any:
        return build_app(KafkaBroker(kafka_bootstrap), settings,
                         loops=[("steady", 0.05, steady), ("sweep", 0.05, tick)])

    async with running(app, kafka_bootstrap, namespace):
        assert await health_of(port, "/livez") == (200, {"status": "ok"})
        assert (await health_of(port, "/readyz") or (0,))[0] == 200
        broken.set()

        body: dict[str, Any] = await eventually(lambda: body_if(port, "/livez", 503),
                                                "/livez 503 once the sweep loop ended")
        assert body["ended"] == ["sweep"]
        assert body["reason"] == "ended: sweep"


async def test_a_consumer_that_ended_makes_livez_503(
        kafka_bootstrap: str, namespace: str, tmp_path: Path) -> None:
    port = free_port()
    settings = settings_for(kafka_bootstrap, namespace, tmp_path, port)
    broker = KafkaBroker(kafka_bootstrap)

    async def on_task(task: OpsTask) -> None:
        return None

    subscribe(broker, settings, Topic.OPS_TASKS, "health-test", on_task)

    async with running(lambda: build_app(broker, settings), kafka_bootstrap, namespace):
        assert await health_of(port, "/livez") == (200, {"status": "ok"})
        (subscriber,) = broker.subscribers
        for task in subscriber.tasks:  # type: ignore[attr-defined]
            task.cancel()  # FastStream restarts a consume task that raised, not this

        body: dict[str, Any] = await eventually(lambda: body_if(port, "/livez", 503),
                                                "/livez 503 once the consumer ended")
        assert body["ended"] == [f"consumer {namespace}.health-test"]


async def test_the_store_services_readiness_asks_its_database(
        kafka_bootstrap: str, namespace: str, tmp_path: Path) -> None:
    port = free_port()
    settings = StoreSettings(kafka_bootstrap_servers=kafka_bootstrap, namespace=namespace,
                             state_dir=str(tmp_path), health_port=port,
                             database_url=f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}")
    async with running(lambda: create_store(settings), kafka_bootstrap, namespace):
        answer = await health_of(port, "/readyz")
        assert answer == (200, {"status": "ready",
                                "checks": {"kafka": "ok", "database": "ok"}})
    started = time.monotonic()
    # Stopped: nothing listens any more.
    assert await health_of(port, "/livez") is None
    assert time.monotonic() - started < 10
