"""`warden`: run the control plane, a local fleet, and watch what it does.

The root app is built here from one module per command group (`warden fleet ...` is
warden/cli/fleet.py) and the modules of the commands without a group."""

from __future__ import annotations

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

app = typer.Typer(help="ClusterWarden: keeps an ML cluster healthy, balanced and right-sized.",
                  no_args_is_help=True)
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
