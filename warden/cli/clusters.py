"""`warden cluster`: name what carries out a cluster's node steps, and enrol its nodes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from common.reportauth import configured_master, enrol_key, ensure_master, write_node_key
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import (
    BACKEND_KINDS,
    CAPACITY_KINDS,
    ClusterBackend,
    cluster_backend,
    name_backend,
)
from warden.cli.common import enrol, identifier, print_json, service_settings, state_dir

app = typer.Typer(help="A cluster's backend (local agents or Kubernetes) and its nodes.",
                  no_args_is_help=True)


@app.command("register")
def register(
    nodes: Annotated[list[str] | None, typer.Argument(
        help="Nodes to enrol (their agents' node ids; on Kubernetes the Node names).")] = None,
    backend: Annotated[str, typer.Option(
        help=f"What carries out node steps: {' | '.join(BACKEND_KINDS)}.")] = "local",
    kubeconfig: Annotated[str, typer.Option(
        help="kubernetes: the kubeconfig file; empty: the in-cluster service account.")] = "",
    context: Annotated[str, typer.Option(help="kubernetes: the kubeconfig's context.")] = "",
    evictions_per_s: Annotated[float, typer.Option(
        min=0.01, help="kubernetes: the cluster's eviction budget, pods per second.")] = 5.0,
    eviction_burst: Annotated[int, typer.Option(
        min=1, help="kubernetes: evictions allowed at once before the rate applies.")] = 5,
    capacity: Annotated[str, typer.Option(
        help=f"kubernetes: where add_capacity takes nodes from: {' | '.join(CAPACITY_KINDS)} "
             "(a MachineDeployment named as the pool).")] = "standby",
    capacity_namespace: Annotated[str, typer.Option(
        help="kubernetes: the namespace of the pools' MachineDeployments.")] = "default",
    default_pool: Annotated[str, typer.Option(
        help="kubernetes: the pool of pending pods that select no clusterwarden.io/pool "
             "(the pool the agents report in).")] = "default",
) -> None:
    """Register WARDEN_CLUSTER_ID with its backend, and enrol NODES."""
    settings = service_settings()
    try:
        config = ClusterBackend(kind=backend,  # type: ignore[arg-type]  # checked just below
                                kubeconfig=kubeconfig, context=context,
                                evictions_per_s=evictions_per_s, eviction_burst=eviction_burst,
                                capacity=capacity,  # type: ignore[arg-type]  # checked too
                                capacity_namespace=capacity_namespace,
                                default_pool=identifier(default_pool))
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--backend/--capacity") from err
    asyncio.run(name_backend(settings.redis_url, settings.namespace, settings.cluster_id, config))
    names = [identifier(n) for n in nodes or []]
    if names:
        enrol(settings, names)
    typer.echo(f"cluster {settings.cluster_id}: backend {config.kind}"
               + (f", {len(names)} node(s) enrolled" if names else ""))


@app.command("show")
def show() -> None:
    """The backend WARDEN_CLUSTER_ID is registered with."""
    settings = service_settings()

    async def read() -> ClusterBackend:
        redis = connect_redis(settings.redis_url)
        try:
            return await cluster_backend(redis, Keys(settings.namespace), settings.cluster_id)
        finally:
            await redis.aclose()

    config = asyncio.run(read())
    print_json({"cluster": settings.cluster_id, **config.__dict__})


@app.command("report-key")
def report_key(
    node: Annotated[str, typer.Argument(help="The node's id (its agent's AGENT_NODE_ID).")],
    out: Annotated[Path, typer.Option(
        help="Where to write the node's key (owner-only): the file its agent is given as "
             "AGENT_REPORT_KEY_FILE.")],
) -> None:
    """Write NODE's report key (of WARDEN_CLUSTER_ID), derived from the collector's master
    (WARDEN_REPORT_MASTER_KEY, else <state>/keys/report-master.key, made if missing)."""
    settings = service_settings()
    master = configured_master(os.environ, state_dir(settings))
    key = enrol_key(ensure_master(master), settings.cluster_id, identifier(node))
    write_node_key(out, key)
    typer.echo(f"report key of {settings.cluster_id}/{key.node_id} (master {key.kid}): {out}")
