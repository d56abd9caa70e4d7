"""`warden nodes`: every node's state, mode, utilisation and jobs (through the API)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from warden.cli import common
from warden.cli.common import (
    JsonOption,
    optional_identifier,
    or_dash,
    print_json,
    table,
    when,
)


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    def util(value: object) -> str:
        return f"{value:.1f}" if isinstance(value, int | float) else "-"

    return table(
        ["CLUSTER", "NODE", "POOL", "STATE", "MODE", "UTIL%", "GPUS", "JOBS", "FAULTS",
         "LAST REPORT"],
        [[n["cluster"], n["node_id"], or_dash(n.get("pool")), n["state"], or_dash(n.get("mode")),
          util(n.get("util_pct")), or_dash(n.get("gpus")),
          ",".join(f"{j['job_id']}:{j['state']}" for j in n.get("jobs") or [])
          or str(n.get("job_count", 0)),
          str(n.get("fault_count", 0)), when(n.get("last_report_at"))] for n in nodes])


def nodes(
    cluster: Annotated[str | None, typer.Option(help="Only this cluster's nodes.",
                                                callback=optional_identifier)] = None,
    as_json: JsonOption = False,
) -> None:
    """Every node: state, mode, GPU utilisation, jobs (through the API)."""
    found = common.from_api(lambda client: client.nodes(cluster))
    if as_json:
        print_json(found)
    elif not found:
        typer.echo("no node has reported or been enrolled")
    else:
        typer.echo(nodes_table(found))
