"""`warden maintenance` and `warden rotation`: intervene on a cluster or a node (through the
API: operator, audited)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from warden.cli import common
from warden.cli.common import JsonOption, ReasonOption, identifier, optional_identifier, print_json

app = typer.Typer(help="Maintenance: pause all automation of a cluster or a node (audited).",
                  no_args_is_help=True)
rotation_app = typer.Typer(help="Rotation: take a node offline for hardware work, then "
                                "online again (audited).", no_args_is_help=True)

ClusterRequired = Annotated[str, typer.Option(help="The cluster.", callback=identifier)]
NodeOptional = Annotated[str | None, typer.Option(
    help="Only this node (else the whole cluster).", callback=optional_identifier)]
NodeRequired = Annotated[str, typer.Option(help="The node.", callback=identifier)]


def describe_window(w: Mapping[str, Any]) -> str:
    scope = f"node {w['node']}" if w.get("node") else "whole cluster"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(w["started_at"])))
    return f"{w['cluster']:<16} {scope:<24} {w['kind']:<12} since {since} by {w['actor']}: " \
           f"{w['reason']}"


@app.command("list")
def maintenance_list(cluster: Annotated[str | None, typer.Option(
        callback=optional_identifier)] = None, as_json: JsonOption = False) -> None:
    """The maintenance windows (and rotations) in force."""
    windows = common.from_api(lambda client: client.maintenance(cluster))
    if as_json:
        print_json(windows)
    elif not windows:
        typer.echo("no maintenance in force: automation runs everywhere")
    for w in [] if as_json else windows:
        typer.echo(describe_window(w))


def _window(step: str, cluster: str, node: str | None, reason: str, as_json: bool) -> None:
    window = common.from_api(
        lambda client: client.maintenance_change(step, cluster, node, reason))
    if as_json:
        print_json(window)
    else:
        done = "started" if step == "start" else "ended"
        typer.echo(f"maintenance {done}: {describe_window(window)}")


@app.command("start")
def maintenance_start(cluster: ClusterRequired, reason: ReasonOption,
                      node: NodeOptional = None, as_json: JsonOption = False) -> None:
    """Pause all automation of the cluster (or of one node): its tasks stay queued."""
    _window("start", cluster, node, reason, as_json)


@app.command("end")
def maintenance_end(cluster: ClusterRequired, reason: ReasonOption,
                    node: NodeOptional = None, as_json: JsonOption = False) -> None:
    """End the maintenance of the cluster (or of one node): its queued tasks may run."""
    _window("end", cluster, node, reason, as_json)


def _rotation(step: str, cluster: str, node: str, reason: str, as_json: bool) -> None:
    accepted = common.from_api(lambda client: client.rotation(step, cluster, node, reason))
    if as_json:
        print_json(accepted)
        return
    typer.echo(f"rotation of node {node} {'started' if step == 'start' else 'ending'}: "
               f"{accepted['need_kind']} need {accepted['need_event_id']} published")


@rotation_app.command("start")
def rotation_start(cluster: ClusterRequired, node: NodeRequired, reason: ReasonOption,
                   as_json: JsonOption = False) -> None:
    """Take the node offline (an offline need, through the templates and budgets); nothing
    else automates it until the rotation ends."""
    _rotation("start", cluster, node, reason, as_json)


@rotation_app.command("end")
def rotation_end(cluster: ClusterRequired, node: NodeRequired, reason: ReasonOption,
                 as_json: JsonOption = False) -> None:
    """Bring the node online again (an online need); its automation resumes."""
    _rotation("end", cluster, node, reason, as_json)
