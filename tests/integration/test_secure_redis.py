"""The secured Redis (docs/security.md, "Redis users") as deploy/local/redis.sh starts it: a
user per service with a password, confined to its namespace's keys and to commands outside
@dangerous, the default user off. The thin slice runs with each service as its own user; a
service user cannot wipe, reconfigure or read the server, nor reach another namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from agent import fleet
from common.messaging import ensure_topics
from common.signing import ensure_signer_keys
from schemas.topics import Topic
from services.shared.redis_access import ADMIN, REDIS_USERS
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    is_success_of,
    is_up,
    name,
    stack_env,
    tap,
    task_events_for,
)
from tests.ports import free_port
from warden import launcher

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "redis.sh"


async def command(client: Redis, *args: str) -> Any:
    """Any command by name (redis-py types `execute_command` loosely)."""
    execute = cast(Callable[..., Awaitable[Any]], client.execute_command)
    return await execute(*args)


@dataclass(frozen=True)
class SecureRedis:
    """A secured redis-server of this module's own, for one namespace."""

    env: dict[str, str]
    namespace: str

    def run(self, *args: str) -> str:
        answer = subprocess.run([str(SCRIPT), *args], env={**os.environ, **self.env},
                                capture_output=True, text=True, check=False, timeout=60)
        if answer.returncode != 0:
            pytest.fail(f"redis.sh {' '.join(args)} failed:\n{answer.stdout}{answer.stderr}",
                        pytrace=False)
        return answer.stdout

    def url(self, user: str) -> str:
        return self.run("url", user).strip()


@pytest.fixture(scope="module")
def secure_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRedis]:
    namespace = f"t{uuid4().hex[:12]}"
    server = SecureRedis({"WARDEN_STATE_DIR": str(tmp_path_factory.mktemp("secure-redis")),
                          "REDIS_SECURITY": "acl", "REDIS_PORT": str(free_port()),
                          "WARDEN_NAMESPACE": namespace}, namespace)
    server.run("start")
    try:
        yield server
    finally:
        server.run("stop")


async def test_the_slice_runs_with_every_service_as_its_own_redis_user(
    secure_redis: SecureRedis, kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = secure_redis.namespace
    admin = secure_redis.url(ADMIN)
    env = stack_env(kafka_bootstrap, admin, namespace, tmp_path, **SMALL_POOL_SAFETY)
    users = {user.value for user in REDIS_USERS}
    await ensure_topics(kafka_bootstrap, namespace)
    # Each service with its own user's URL; those that keep nothing in Redis get no password.
    no_password = admin.split("//", 1)[0] + "//" + admin.rsplit("@", 1)[1]
    running = [svc for service in launcher.SERVICES
               for svc in launcher.start_services(tmp_path, {
                   **env, "REDIS_URL": secure_redis.url(service) if service in users
                   else no_password}, (service,))]
    trusted = ensure_signer_keys(tmp_path / "keys")
    failed = True
    try:
        agents = fleet.fleet_up(3, 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        await register(admin, namespace, "itest", [a.node_id for a in agents])
        async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                       name(Topic.OPS_NODE_STATE, namespace)) as watch:
            for node in ("node-001", "node-002", "node-003"):
                await watch.wait_for(is_up(node), 120, f"{node} up")
            fleet.inject_fault(tmp_path, "node-002", xid=[79])
            await watch.wait_for(is_success_of(watch, "node-002"), 120,
                                 "the offline task for node-002 to succeed")
            assert task_events_for(watch, "node-001") == []
        assert not launcher.dead_services(running), [s.name for s in
                                                     launcher.dead_services(running)]
        # Nothing any service did was refused by the ACL (the server logs every refusal).
        server = Redis.from_url(admin)
        try:
            refusals = await command(server, "ACL", "LOG")
        finally:
            await server.aclose()
        assert refusals == []
        failed = False
    finally:
        fleet.fleet_down(tmp_path)
        launcher.stop_services(running)
        if failed:
            for svc in running:
                print(f"----- {svc.name} log (last 30 lines) -----")
                print("\n".join(svc.log_path.read_text(errors="replace").splitlines()[-30:]))


@pytest.mark.parametrize("user", [user.value for user in REDIS_USERS])
async def test_a_service_user_reaches_its_namespace_only_and_no_dangerous_command(
    secure_redis: SecureRedis, user: str
) -> None:
    mine = Keys(secure_redis.namespace).prefix + f"acl-test:{user}"
    theirs = Keys("another-namespace").prefix + "acl-test"
    client = connect_redis(secure_redis.url(user), 2.0, 3.0)
    try:
        assert await client.set(mine, b"1", ex=60)
        assert await client.get(mine) == b"1"
        script = client.register_script("return redis.call('GET', KEYS[1])")
        assert await script(keys=[mine]) == b"1"
        with pytest.raises(NoPermissionError):
            await client.set(theirs, b"1")
        with pytest.raises(NoPermissionError):
            await client.get(theirs)
        with pytest.raises(ResponseError):  # a script naming the key is refused as well
            await script(keys=[theirs])
        # (DEBUG too is @dangerous; redis-server refuses it to every client by default.)
        for refused in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
                        ("ACL", "LIST"), ("SHUTDOWN",),
                        ("REPLICAOF", "NO", "ONE"), ("MONITOR",), ("INFO",)):
            with pytest.raises(NoPermissionError):
                await command(client, *refused)
    finally:
        await client.aclose()


async def test_a_client_without_a_user_or_with_a_wrong_password_is_refused(
    secure_redis: SecureRedis
) -> None:
    url = secure_redis.url("collector")
    anonymous = Redis.from_url(url.split("//", 1)[0] + "//" + url.rsplit("@", 1)[1])
    wrong = Redis.from_url(url.replace("collector:", "collector:not-", 1))
    try:
        # Refused at the handshake (or, with an older client, at the first command: NOAUTH).
        with pytest.raises((AuthenticationError, ResponseError),
                           match=r"NOAUTH|authenticated"):
            await anonymous.get(Keys(secure_redis.namespace).prefix + "x")
        with pytest.raises(AuthenticationError):
            await wrong.ping()
    finally:
        await anonymous.aclose()
        await wrong.aclose()
