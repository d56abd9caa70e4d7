"""`warden alerts`: list the alerts (firing first) and acknowledge one (through the API:
operator, audited)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from warden.cli import common
from warden.cli.common import (
    ClusterOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    ReasonOption,
    identifier,
    or_dash,
    print_json,
    print_page,
    table,
    when,
)

app = typer.Typer(help="Alerts: list them (firing first), acknowledge one (operator; "
                  "audited).", no_args_is_help=True)

STATUSES = ("firing", "resolved")


def valid_status(value: str | None) -> str | None:
    if value is None or value in STATUSES:
        return value
    raise typer.BadParameter(f"{value!r}: one of {', '.join(STATUSES)}")


def acknowledged(alert: Mapping[str, Any]) -> str:
    """`who: why` of an acknowledged alert, '-' otherwise."""
    who = alert.get("acknowledged_by")
    return f"{who}: {or_dash(alert.get('ack_reason'))}" if who else "-"


def alerts_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return table(["STATUS", "SEVERITY", "CLUSTER", "KIND", "DEDUP KEY", "SINCE", "TIMES",
                  "ACKNOWLEDGED", "MESSAGE", "RESOLUTION"],
                 [[a["status"], a["severity"], a["cluster_id"], a["kind"], a["dedup_key"],
                   when(a.get("starts_at")), str(a.get("occurrences", 0)), acknowledged(a),
                   or_dash(a.get("message")), or_dash(a.get("resolution"))] for a in rows],
                 max_width=48)


@app.command("list")
def alerts_list(
    status: Annotated[str | None, typer.Option(help="firing or resolved (default: both).",
                                               callback=valid_status)] = None,
    cluster: ClusterOption = None,
    limit: LimitOption = 50,
    offset: OffsetOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Alerts, firing first, then the most recently changed."""
    page = common.from_api(lambda client: client.alerts(
        status=status, cluster=cluster, limit=limit, offset=offset))
    print_page(page, as_json, offset, alerts_table, "alert")


@app.command("ack")
def alerts_ack(
    cluster: Annotated[str, typer.Argument(help="The alert's cluster.", callback=identifier)],
    dedup_key: Annotated[str, typer.Argument(help="The alert's dedup key, as `list` shows it.",
                                             callback=identifier)],
    reason: ReasonOption,
    as_json: JsonOption = False,
) -> None:
    """Acknowledge an alert (operator): someone has seen it; it fires on until its cause
    ends. Audited under the API token's user, and told to Alertmanager and the webhooks."""
    alert = common.from_api(lambda client: client.ack_alert(cluster, dedup_key, reason))
    if as_json:
        print_json(alert)
        return
    typer.echo(f"alert {cluster}/{dedup_key} ({alert['status']}) acknowledged by "
               f"{alert['acknowledged_by']}: {alert['ack_reason']}")
