"""The capacity provider port: standby nodes a pool can grow into, and how they come and go.

A provider owns the nodes it added (so a scale-in prefers them and can hand them back); its
state lives in Redis, never in the process, so any executor instance can release what
another one acquired. `local` starts standby agent processes on this machine; `none` has
no standby capacity at all. Other providers (Kubernetes, Slurm, a cloud API) plug in here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from common.errors import PermanentError

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from services.capacity.settings import CapacitySettings
    from services.shared.redis_client import Keys


@dataclass(frozen=True)
class NodeOffer:
    """A node a pool could gain (or, when planning a scale-in, could give up)."""

    node_id: str
    gpus: int


class CapacityProvider(Protocol):
    """Where capacity comes from. Every call is safe to repeat."""

    name: str

    async def standby(self, cluster: str, pool: str) -> list[NodeOffer]:
        """Nodes that could be added to the pool now (not yet in use anywhere)."""
        ...

    async def acquire(self, cluster: str, pool: str, node_ids: list[str],
                      request_id: str) -> list[str]:
        """Add these nodes to the pool; returns the ones added.

        Idempotent per `request_id`: a repeat returns the same nodes and starts nothing new.
        """
        ...

    async def release(self, cluster: str, node_id: str, request_id: str) -> bool:
        """Hand a node back (stop it, unenrol it); True if this provider owned it."""
        ...

    async def owned(self, cluster: str, pool: str) -> list[str]:
        """The nodes of the pool this provider added and has not released."""
        ...

    async def restart_agent(self, cluster: str, node_id: str, request_id: str) -> None:
        """Start a node's agent again (the node lives; its agent died or hung).

        Idempotent per `request_id`. Raises NotSupportedError where the provider cannot.
        """
        ...


class NotSupportedError(PermanentError):
    """The provider cannot do this at all: retrying will not help."""

    def __init__(self, detail: str) -> None:
        super().__init__("not_supported", detail)


@dataclass(frozen=True)
class ProviderContext:
    """What a provider may need from the centre that builds it."""

    redis: Redis
    keys: Keys
    settings: CapacitySettings
    # Where local agents keep their state, the environment they inherit, and the public
    # keys they trust (the executor's own signing key): only the local provider uses these.
    state_dir: Path
    namespace: str
    env: Mapping[str, str] = field(default_factory=dict)
    trusted_keys: tuple[Path, ...] = ()


class NoneProvider:
    """No standby capacity: adding capacity completes with nothing added, and says why."""

    name = "none"

    async def standby(self, cluster: str, pool: str) -> list[NodeOffer]:
        return []

    async def acquire(self, cluster: str, pool: str, node_ids: list[str],
                      request_id: str) -> list[str]:
        return []

    async def release(self, cluster: str, node_id: str, request_id: str) -> bool:
        # A node this provider never added stays drained: nothing here can stop it.
        return False

    async def owned(self, cluster: str, pool: str) -> list[str]:
        return []

    async def restart_agent(self, cluster: str, node_id: str, request_id: str) -> None:
        raise NotSupportedError(
            f"the {self.name} capacity provider cannot restart the agent of {node_id}: "
            "restart it on the node (or configure a provider that can)")


def _none(context: ProviderContext) -> CapacityProvider:
    return NoneProvider()


def _local(context: ProviderContext) -> CapacityProvider:
    # Imported here: the local provider pulls in the agent fleet tooling, which only this
    # provider needs.
    from services.capacity.local import LocalProvider

    return LocalProvider.from_context(context)


ProviderFactory = Callable[[ProviderContext], CapacityProvider]

# Explicit and ordered; CAPACITY_PROVIDER names one of them.
PROVIDERS: dict[str, ProviderFactory] = {
    "local": _local,  # standby agent processes on this machine (demo, tests, one host)
    "none": _none,  # a fixed fleet: scale-out adds nothing, scale-in only drains
}


def build_provider(context: ProviderContext) -> CapacityProvider:
    """The provider CAPACITY_PROVIDER names."""
    name = context.settings.provider
    try:
        factory = PROVIDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown capacity provider {name!r}; expected one of {sorted(PROVIDERS)}"
        ) from None
    return factory(context)
