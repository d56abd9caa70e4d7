"""`warden breaker`: list the circuit breakers, reset one (audited)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from schemas.events.v1 import Alert
from schemas.topics import Topic
from services.scheduler.breaker import SCOPE_SEPARATOR, BreakerState, breaker_named
from services.scheduler.breaker_store import BreakerReset, BreakerStore
from services.scheduler.handlers import reset_alert
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog
from services.shared.messaging import EventBus, make_broker
from services.shared.redis_client import Keys, connect_redis
from services.shared.settings import ServiceSettings
from services.shared.telemetry import setup_telemetry
from warden.cli.common import identifier, optional_identifier, valid_reason

app = typer.Typer(help="Circuit breakers: list them, reset one (audited).",
                  no_args_is_help=True)


CLI_SOURCE = "warden-cli"


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


async def publish_alert(settings: ServiceSettings, alert: Alert) -> None:
    """Publish one alert with the services' own broker settings (idempotent, acks=all)."""
    broker, _ = make_broker(settings, "cli", setup_telemetry("warden-cli"))
    await broker.start()
    try:
        await EventBus(broker, settings.namespace).publish(Topic.OPS_ALERTS, alert)
    finally:
        await broker.stop()


class NoSuchBreaker(Exception):
    """A reset named a breaker that has never recorded an outcome (a typo, most likely)."""


async def reset_breaker(settings: SchedulerSettings, cluster: str, name: str, actor: str,
                        reason: str) -> BreakerReset:
    """Close the breaker and append its audit entry in one atomic step."""
    redis = connect_redis(settings.redis_url)
    try:
        keys = Keys(settings.namespace)
        store = BreakerStore(redis, keys, settings.breaker_config)
        # Resetting a misspelt breaker would report success and leave the real one open.
        if not await redis.exists(store.key(cluster, name)):
            raise NoSuchBreaker(f"no breaker {cluster}/{name}; `warden breaker list` shows "
                                "every breaker")
        return await store.reset(cluster, name, actor, reason, AuditLog(redis, keys))
    finally:
        await redis.aclose()


@app.command("list")
def breaker_list(
    cluster: Annotated[str | None, typer.Option(
        help="Only this cluster's breakers.", callback=optional_identifier)] = None,
) -> None:
    """Every breaker's state, per cluster and kind (kind@node with the node scope)."""
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
    actor: Annotated[str, typer.Option(help="Who resets it (recorded in the audit log).",
                                       callback=identifier)],
    reason: Annotated[str, typer.Option(help="Why (recorded in the audit log).",
                                        callback=valid_reason)],
    node: Annotated[str | None, typer.Option(
        help="The node, for node-scoped breakers.", callback=optional_identifier)] = None,
) -> None:
    """Close a breaker (an admin action): audited, and announced with an info alert."""
    try:
        name = breaker_named(kind, node)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--kind") from err
    base, _, target = name.partition(SCOPE_SEPARATOR)
    identifier(base)
    if target:
        identifier(target)
    settings = SchedulerSettings()
    try:
        reset = asyncio.run(reset_breaker(settings, cluster, name, actor, reason))
    except NoSuchBreaker as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(1) from err
    typer.echo(f"breaker {cluster}/{name}: {reset.before.status} -> {reset.after.status}; "
               f"audit entry {reset.record.entry.seq} ({reset.record.id})")
    try:
        asyncio.run(publish_alert(settings, reset_alert(cluster, name, reset, CLI_SOURCE)))
    except Exception as err:
        # The reset and its audit entry stand; only the announcement is missing.
        typer.echo(f"the breaker_reset alert could not be published: {err!r}", err=True)
        raise typer.Exit(1) from err
