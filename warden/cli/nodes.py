"""`warden nodes`: every node's state, mode, utilisation and jobs; `warden nodes enroll`: a
node registered and given its report key (both through the API)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from common.reportauth import NodeReportKey, write_node_key
from warden.cli import common
from warden.cli.common import (
    JsonOption,
    identifier,
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


app = typer.Typer(help="Nodes: list them (the default), enrol one.",
                  invoke_without_command=True)


@app.callback()
def nodes(
    context: typer.Context,
    cluster: Annotated[str | None, typer.Option(help="Only this cluster's nodes.",
                                                callback=optional_identifier)] = None,
    as_json: JsonOption = False,
) -> None:
    """Every node: state, mode, GPU utilisation, jobs (through the API)."""
    if context.invoked_subcommand is not None:
        return
    found = common.from_api(lambda client: client.nodes(cluster))
    if as_json:
        print_json(found)
    elif not found:
        typer.echo("no node has reported or been enrolled")
    else:
        typer.echo(nodes_table(found))


@app.command("enroll")
def enroll(
    node: Annotated[str, typer.Argument(help="The node's id (its agent's AGENT_NODE_ID).",
                                        callback=identifier)],
    out: Annotated[Path, typer.Option(
        help="Where to write the node's report key (owner-only): the file its agent is given "
             "as AGENT_REPORT_KEY_FILE.")],
    cluster: Annotated[str, typer.Option(help="The node's cluster.", callback=identifier)],
) -> None:
    """Enrol NODE in CLUSTER and write its report key (admin; audited). Enrolling a node
    again hands out the same key, for an agent that lost its own."""
    enrolled = common.from_api(lambda client: client.enroll(cluster, node))
    key = NodeReportKey.from_json(json.dumps(enrolled["report_key"]))
    write_node_key(out, key)
    typer.echo(f"{'enrolled' if enrolled['new'] else 're-enrolled'} {cluster}/{node} "
               f"(report master {key.kid}): its key is in {out}")
