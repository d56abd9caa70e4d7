"""What the fault scenarios share: a small stack with a local fleet, a fault on one node, and
a service that dies at a crash point (common/crashpoints.py) and is started again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from agent import fleet
from common.crashpoints import ENV as CRASH_AT
from common.crashpoints import EXIT_CODE
from common.signing import ensure_signer_keys
from services.shared.registry import register
from tests.integration.harness import SMALL_POOL_SAFETY, Tap, is_up, services, stack_env, until
from warden import launcher

CLUSTER = "itest"
NODES = ["node-001", "node-002"]
TARGET = "node-002"  # the node a scenario's fault is on
# The services a fault on a node goes through until the node is offline.
FLOW = ("collector", "analyzer", "templater", "scheduler", "executor")


def fault_env(kafka: str, redis_url: str, namespace: str, state_dir: Path,
              point: str) -> dict[str, str]:
    """Offline needs only, no centre probes (the agents' journals hold only what tasks sent),
    a pool of two where one faulty node may go offline, a relay grace of 2 s, and `point`
    armed."""
    return stack_env(kafka, redis_url, namespace, state_dir, WARDEN_LOG_LEVEL="INFO",
                     AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]',
                     COLLECTOR_PROBE_PERIOD_S="3600", WARDEN_OUTBOX_GRACE_S="2",
                     **SMALL_POOL_SAFETY, **{CRASH_AT: point})


@asynccontextmanager
async def stack_with_fleet(redis_url: str, namespace: str, state_dir: Path,
                           env: dict[str, str], names: tuple[str, ...],
                           nodes: list[str] = NODES,
                           ) -> AsyncIterator[list[launcher.ServiceProcess]]:
    """`names` running as processes, and an agent per node of `nodes` (node-001 on),
    enrolled."""
    trusted = ensure_signer_keys(state_dir / "keys")
    async with services(env, state_dir, names) as running:
        await register(redis_url, namespace, CLUSTER, nodes)
        fleet.fleet_up(len(nodes), 1, CLUSTER, namespace, state_dir, env, trusted, 1.0)
        try:
            yield running
        finally:
            fleet.fleet_down(state_dir)


async def all_up(watch: Tap, nodes: list[str] = NODES) -> None:
    """Every node of `nodes` reported up (the tap reads the node-state topic)."""
    for node in nodes:
        await watch.wait_for(is_up(node), 90, f"{node} up")


async def crashed(running: list[launcher.ServiceProcess], service: str, point: str) -> int:
    """Wait for `service` to die at crash point `point`; its index in `running`."""
    index = next(i for i, s in enumerate(running) if s.name == service)
    victim = running[index]
    await until(lambda: victim.process.poll() is not None, 120,
                f"the {service} to die at {point}")
    assert victim.process.returncode == EXIT_CODE
    assert f"crash point {point}" in victim.log_path.read_text(errors="replace")
    return index


def restart(running: list[launcher.ServiceProcess], index: int, state_dir: Path,
            env: dict[str, str]) -> None:
    """The dead service again, unarmed (it counts as replaced, not as died)."""
    healthy = {k: v for k, v in env.items() if k != CRASH_AT}
    running[index] = launcher.start_services(state_dir, healthy, (running[index].name,))[0]
