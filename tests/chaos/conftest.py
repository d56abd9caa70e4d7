"""Fixtures of the fault scenarios: a Kafka broker and Redis servers of a test's own, which the
test may kill, pause, cut off, roll back and start again (the suite's shared servers must never
be taken down)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis import Redis as SyncRedis

from tests.chaos.proxy import PartitionProxy
from tests.conftest import redis_answers
from tests.ports import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "deploy" / "local" / "kafka.sh"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class PrivateBroker:
    """A single-node KRaft broker started by deploy/local/kafka.sh in a folder of its own."""

    state_dir: Path
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _script(self, command: str) -> None:
        env = {**os.environ, "WARDEN_STATE_DIR": str(self.state_dir),
               "KAFKA_PORT": str(self.port), "KAFKA_CONTROLLER_PORT": str(self.controller_port),
               "KAFKA_HEAP": "512m"}
        subprocess.run([str(KAFKA_SH), command], env=env, check=True, timeout=180,
                       stdout=subprocess.DEVNULL)

    def start(self) -> None:
        """Start it (again, on the same data) and wait until it serves metadata."""
        self._script("start")

    def stop(self) -> None:
        self._script("stop")

    @property
    def pid(self) -> int:
        return int((self.state_dir / "kafka" / "kafka.pid").read_text().strip())

    def kill(self) -> None:
        """Kill -9: the broker dies with what it had not flushed."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        # Not our child (the script starts it with nohup): gone once it cannot be signalled.
        wait_until(lambda: not alive(pid), f"the killed broker (pid {pid}) gone")

    def pause(self) -> None:
        """SIGSTOP: hung, not dead (connections stay open, nothing answers)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(tmp_path / "private-kafka", free_port(), free_port())
    broker.state_dir.mkdir()
    broker.start()
    try:
        yield broker
    finally:
        with contextlib.suppress(OSError, ValueError):  # not paused, or not running
            broker.resume()
        broker.stop()


@pytest.fixture
async def partitionable_redis(
    private_redis: tuple[str, subprocess.Popen[bytes]],
) -> AsyncIterator[tuple[str, PartitionProxy]]:
    """A redis-server of the test's own (its direct URL) and a proxy in front of it."""
    url, _ = private_redis
    parts = urlsplit(url)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    await proxy.start()
    try:
        yield url, proxy
    finally:
        await proxy.close()


@dataclass
class RestartableRedis:
    """A redis-server of the test's own that saves only when told, and may be killed and
    started again on the same port and folder (loading whatever dump.rdb holds then)."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def dump(self) -> Path:
        return self.folder / "dump.rdb"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--dbfilename", self.dump.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: redis_answers(self.url),
                   f"redis-server on port {self.port} answering")

    def save(self) -> None:
        """A snapshot of now, in dump.rdb."""
        client = SyncRedis.from_url(self.url)
        try:
            client.save()
        finally:
            client.close()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def restartable_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    folder = tmp_path / "restartable-redis"
    folder.mkdir()
    server = RestartableRedis(folder, free_port())
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
