"""`warden`: run the control plane, a local fleet, and watch what it does.

The root app is built here from one module per command group (`warden fleet ...` is
warden/cli/fleet.py) and the modules of the commands without a group."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from warden.cli import (
    alerts,
    api,
    audit,
    breaker,
    clusters,
    demo,
    events,
    fleet,
    local,
    maintenance,
    ml,
    nodes,
    secrets,
    tasks,
    templates,
)
from warden.cli.common import exit_codes_text

PACKAGE = "clusterwarden"

app = typer.Typer(help="ClusterWarden: keeps an ML cluster healthy, balanced and right-sized.",
                  epilog=exit_codes_text(), no_args_is_help=True)


def package_version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (the package is not installed)"


def show_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"warden {package_version()}")
        raise typer.Exit()


@app.callback()
def root(version_wanted: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", callback=show_version,
        is_eager=True)] = False) -> None:
    """The options of `warden` itself, before any command (the help is the app's)."""


for command in (local.keys, local.topics, events.events, local.up, demo.demo, ml.submit):
    app.command()(command)
for name, group in (("nodes", nodes.app), ("fleet", fleet.app), ("cluster", clusters.app),
                    ("breaker", breaker.app), ("tasks", tasks.app),
                    ("templates", templates.app), ("api", api.app), ("ml", ml.app),
                    ("alerts", alerts.app), ("maintenance", maintenance.app),
                    ("rotation", maintenance.rotation_app), ("audit", audit.app),
                    ("secrets", secrets.app)):
    app.add_typer(group, name=name)


def main() -> None:
    app()
