"""`warden breaker`: list the circuit breakers, reset one (through the API: admin, audited)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from schemas.events.v1 import BreakerScope
from services.scheduler.breaker import (
    SCOPE_SEPARATOR,
    WHOLE_CLUSTER,
    BreakerState,
    breaker_named,
)
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.settings import SchedulerSettings
from services.shared.redis_client import Keys, connect_redis
from warden.cli import common
from warden.cli.common import identifier, optional_identifier, valid_reason

app = typer.Typer(help="Circuit breakers: list them, reset one (audited).",
                  no_args_is_help=True)


def describe_breaker(cluster: str, name: str, state: BreakerState | None) -> str:
    """One readable line per breaker for `warden breaker list`."""
    if state is None:
        return f"{cluster:<16} {name:<28} UNREADABLE (automation of it is held: fail closed)"
    window = "".join("F" if failed else "S" for failed in state.window) or "-"
    line = (f"{cluster:<16} {name:<28} {state.status:<9} window {window:<10} "
            f"consecutive {state.consecutive_failures}  openings {state.openings}")
    if state.opened_at is not None and state.status != "CLOSED":
        line += "  opened " + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(state.opened_at))
    if state.status == "HALF_OPEN":
        line += f"  trial {state.trial_task}"
    return line


async def list_breakers(settings: SchedulerSettings,
                        cluster: str | None) -> list[tuple[str, str, BreakerState | None]]:
    redis = connect_redis(settings.redis_url)
    try:
        store = BreakerStore(redis, Keys(settings.namespace), settings.breaker_config)
        return [row for row in await store.states() if cluster is None or row[0] == cluster]
    finally:
        await redis.aclose()


@app.command("list")
def breaker_list(
    cluster: Annotated[str | None, typer.Option(
        help="Only this cluster's breakers.", callback=optional_identifier)] = None,
) -> None:
    """Every breaker's state, per cluster and kind (kind@node with the node scope, kind@*
    with the cluster scope)."""
    rows = asyncio.run(list_breakers(SchedulerSettings(), cluster))
    if not rows:
        typer.echo("no breaker has recorded an outcome yet (all closed)")
    for row in rows:
        typer.echo(describe_breaker(*row))


@app.command("reset")
def breaker_reset(
    cluster: Annotated[str, typer.Option(help="The breaker's cluster.", callback=identifier)],
    kind: Annotated[str, typer.Option(
        help="The task kind (offline, migrate, ...), or kind@node as `list` shows it.")],
    reason: Annotated[str, typer.Option(help="Why (recorded in the audit log).",
                                        callback=valid_reason)],
    node: Annotated[str | None, typer.Option(
        help="The node, for node-scoped breakers.", callback=optional_identifier)] = None,
    scope: Annotated[BreakerScope | None, typer.Option(
        help="kind, node or cluster (cluster: the breaker kind@* that stops the whole "
             "cluster).")] = None,
) -> None:
    """Close a breaker (admin, through the API): audited under the API token's user, and
    announced with an info alert."""
    try:
        name = breaker_named(kind, node, scope)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--kind") from err
    base, _, target = name.partition(SCOPE_SEPARATOR)
    identifier(base)
    if target and target != WHOLE_CLUSTER:
        identifier(target)
    reset = common.from_api(lambda client: client.reset_breaker(cluster, kind, reason, node,
                                                                scope))
    typer.echo(f"breaker {cluster}/{name}: {reset['before']['status']} -> "
               f"{reset['after']['status']}; audit entry {reset['audit_seq']}")
    if not reset["alert_published"]:
        # The reset and its audit entries stand; only the announcement is missing.
        typer.echo("the breaker_reset alert could not be published", err=True)
        raise typer.Exit(common.EXIT_FAILED)
