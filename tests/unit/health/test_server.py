"""The health server on the loopback (common/health/server.py): it answers probes
from its endpoints and holds up against what a hostile network sends (a head too long, a
client too slow, a body, too many connections), and keeps serving after each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from common.health.http import MAX_HEAD_BYTES
from common.health.policy import Answer
from common.health.server import HealthServer

READ_TIMEOUT_S = 0.3


async def alive() -> Answer:
    return Answer(200, {"status": "ok"})


async def unready() -> Answer:
    return Answer(503, {"status": "unready", "failed": ["redis"]})


@pytest.fixture
async def server() -> AsyncIterator[HealthServer]:
    served = HealthServer("127.0.0.1", 0, alive, unready, read_timeout_s=READ_TIMEOUT_S,
                          max_connections=2)
    await served.start()
    try:
        yield served
    finally:
        await served.close()


async def exchange(server: HealthServer, request: bytes) -> tuple[int, bytes]:
    """Send `request`, read the whole response: its status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(5):
            response = await reader.read()
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_probes_get_the_endpoints_answers(server: HealthServer) -> None:
    assert await exchange(server, b"GET /livez HTTP/1.1\r\nHost: pod\r\n\r\n") == (
        200, b'{"status":"ok"}')
    status, body = await exchange(server, b"GET /readyz HTTP/1.1\r\n\r\n")
    assert (status, json.loads(body)["failed"]) == (503, ["redis"])
    assert await exchange(server, b"HEAD /livez HTTP/1.1\r\n\r\n") == (200, b"")
    assert (await exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 404


async def test_a_body_is_never_read(server: HealthServer) -> None:
    # The body announced never comes: the answer does not wait for it.
    request = b"POST /livez HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n"
    assert (await exchange(server, request))[0] == 405


async def test_a_head_too_long_is_refused_and_not_buffered(server: HealthServer) -> None:
    request = b"GET /livez HTTP/1.1\r\nX-Pad: " + b"a" * (2 * MAX_HEAD_BYTES) + b"\r\n\r\n"
    assert (await exchange(server, request))[0] == 431
    assert (await exchange(server, b"GET /livez HTTP/1.1\r\n\r\n"))[0] == 200


async def test_a_client_too_slow_is_answered_408_and_dropped(server: HealthServer) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await exchange(server, b"GET /livez HTTP/1.1\r\n"))[0] == 408
    assert loop.time() - started < READ_TIMEOUT_S + 1


async def test_connections_beyond_the_bound_are_dropped_at_once(server: HealthServer) -> None:
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    await asyncio.sleep(0.05)  # both accepted and waiting for their heads
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /livez HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(READ_TIMEOUT_S / 2):
        try:
            dropped = await reader.read()
        except ConnectionResetError:
            dropped = b""
    assert dropped == b""
    writer.close()
    for _, idle_writer in idle:
        idle_writer.close()
    await asyncio.sleep(READ_TIMEOUT_S + 0.1)  # the idle ones timed out: room again
    assert (await exchange(server, b"GET /livez HTTP/1.1\r\n\r\n"))[0] == 200


async def test_a_client_that_hangs_up_midway_leaves_the_server_serving(
        server: HealthServer) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /liv")
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.05)
    assert (await exchange(server, b"GET /livez HTTP/1.1\r\n\r\n"))[0] == 200
