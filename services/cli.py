"""`warden`: run the control plane, a local fleet, and watch what it does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaConsumer
from pydantic import TypeAdapter, ValidationError

from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Identifier, Reason
from schemas.events.v1 import Alert, NodeState, OpsNeed, TaskEvent
from schemas.topics import Topic, topic_name
from services import launcher
from services.scheduler.breaker import SCOPE_SEPARATOR, BreakerState, breaker_name
from services.scheduler.breaker_store import BreakerReset, BreakerStore
from services.scheduler.handlers import reset_alert
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog
from services.shared.messaging import EventBus, ensure_topics, make_broker
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.shared.settings import ServiceSettings
from services.shared.signing import ensure_keypair
from services.shared.telemetry import setup_telemetry

app = typer.Typer(help="ClusterWarden: keeps an ML cluster healthy, balanced and right-sized.",
                  no_args_is_help=True)
fleet_app = typer.Typer(help="A local fleet of agent processes.", no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")
breaker_app = typer.Typer(help="Circuit breakers: list them, reset one (audited).",
                          no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")

WATCHED = (Topic.OPS_NODE_STATE, Topic.OPS_NEEDS, Topic.OPS_TASK_EVENTS, Topic.OPS_ALERTS)


def _settings() -> ServiceSettings:
    return ServiceSettings()


def _state_dir(settings: ServiceSettings) -> Path:
    return Path(settings.state_dir).resolve()


def _service_env(settings: ServiceSettings) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "REDIS_URL": settings.redis_url,
        "WARDEN_NAMESPACE": settings.namespace,
        "WARDEN_CLUSTER_ID": settings.cluster_id,
        "WARDEN_STATE_DIR": str(_state_dir(settings)),
    }


def _enrol(settings: ServiceSettings, nodes: list[str]) -> None:
    """Register local agents: the collector quarantines reports from unknown nodes."""
    asyncio.run(register(settings.redis_url, settings.namespace, settings.cluster_id, nodes))


@app.command()
def keys() -> None:
    """Create the command-signing key pair in the state folder (if missing)."""
    private, public = ensure_keypair(_state_dir(_settings()) / "keys")
    typer.echo(f"private key: {private}\npublic key:  {public}")


@app.command()
def topics() -> None:
    """Create every topic (and dead-letter topic) of the namespace."""
    settings = _settings()
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace))
    typer.echo("topics ready")


def describe(topic: Topic, body: bytes) -> str:
    """One readable line for an event on a watched topic."""
    event = TOPIC_MODELS[topic].model_validate_json(body)
    stamp = event.occurred_at.strftime("%H:%M:%S")
    if isinstance(event, NodeState):
        return (f"{stamp} node   {event.node_id:<10} {event.previous or '-'} -> {event.state}"
                f"  ({event.reason})")
    if isinstance(event, OpsNeed):
        ev = event.evidence[0]
        return (f"{stamp} need   {event.kind:<8} {event.target:<10} {ev.metric}={ev.value:g} "
                f"outside [{ev.range_low:g}, {ev.range_high:g}] {ev.detail}")
    if isinstance(event, TaskEvent):
        step = ""
        if event.step_index is not None:
            step = f" step {event.step_index} {event.step_state}"
        child = f" (child of {str(event.parent_task_id)[:8]})" if event.parent_task_id else ""
        return (f"{stamp} task   {str(event.task_id)[:8]}  {event.state}{step}  {event.reason}"
                f"{child}{step_effect(event.outputs)}")
    if isinstance(event, Alert):
        return f"{stamp} ALERT  {event.severity:<8} {event.kind}: {event.message}"
    return f"{stamp} {event.event_type}"


def step_effect(outputs: Mapping[str, object]) -> str:
    """What a completed step did, in a few words, for the steps an operator cares about."""
    if "resumed_step" in outputs and outputs.get("started"):
        return (f"\n           -> job {outputs.get('job_id')} runs again, from step "
                f"{outputs['resumed_step']}")
    if "step" in outputs and "checkpoint" in outputs:
        return f"\n           -> job {outputs.get('job_id')} checkpointed at step {outputs['step']}"
    if outputs.get("added"):
        return f"\n           -> added {outputs.get('added_nodes')}: {outputs.get('reason')}"
    if outputs.get("released"):
        return f"\n           -> {outputs.get('node')} {outputs.get('reason')}"
    return ""


async def watch(settings: ServiceSettings, until_task_state: str | None = None,
                timeout_s: float | None = None) -> int:
    """Print node states, needs and task events as they happen; returns 0 on `until` state."""
    names = {topic_name(t, settings.namespace): t for t in WATCHED}
    consumer = AIOKafkaConsumer(*names, bootstrap_servers=settings.kafka_bootstrap_servers,
                                auto_offset_reset="latest", enable_auto_commit=False)
    await consumer.start()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while deadline is None or time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    topic = names[record.topic]
                    try:
                        typer.echo(describe(topic, record.value or b""))
                    except ValueError as err:
                        typer.echo(f"(unreadable event on {record.topic}: {err})")
                        continue
                    if until_task_state and topic is Topic.OPS_TASK_EVENTS:
                        event = json.loads(record.value or b"{}")
                        if event.get("state") == until_task_state:
                            return 0
        return 1
    finally:
        await consumer.stop()


@app.command()
def events() -> None:
    """Follow node states, needs and task transitions (Ctrl-C to stop)."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(watch(_settings()))


@app.command()
def up() -> None:
    """Run every control-plane service, each in its own process, until Ctrl-C."""
    settings = _settings()
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace))
    services = launcher.start_services(_state_dir(settings), _service_env(settings))
    typer.echo("services: " + ", ".join(f"{s.name} (pid {s.process.pid})" for s in services))
    try:
        while not launcher.dead_services(services):
            time.sleep(1.0)
        for svc in launcher.dead_services(services):
            typer.echo(f"{svc.name} exited ({svc.process.returncode}); see {svc.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        launcher.stop_services(services)


@fleet_app.command("up")
def fleet_up(
    nodes: Annotated[int, typer.Option(min=1, max=500)] = 3,
    gpus: Annotated[int, typer.Option(min=0, max=64)] = 2,
    interval: Annotated[float, typer.Option(help="Report interval in seconds.")] = 2.0,
    jobs: Annotated[str, typer.Option(
        help="ML jobs per agent: train,infer | '' for none | sim (no processes).")] = "train,infer",
    first: Annotated[int, typer.Option(min=1, help="Number of the first node.")] = 1,
) -> None:
    """Start NODES local agent processes."""
    from agent import fleet

    settings = _settings()
    state = _state_dir(settings)
    _, public = ensure_keypair(state / "keys")
    agents = fleet.fleet_up(nodes, gpus, settings.cluster_id, settings.namespace, state,
                            _service_env(settings), [public], interval, first=first, jobs=jobs)
    _enrol(settings, [a.node_id for a in agents])
    typer.echo(f"started {len(agents)} agents: " + ", ".join(a.node_id for a in agents))


@fleet_app.command("down")
def fleet_down() -> None:
    """Stop every local agent."""
    from agent import fleet

    fleet.fleet_down(_state_dir(_settings()))
    typer.echo("fleet stopped")


@fleet_app.command("fault")
def fleet_fault(
    node: str,
    xid: Annotated[list[int] | None, typer.Option(help="Inject a GPU XID event.")] = None,
    ecc: Annotated[int, typer.Option(help="Uncorrected ECC errors.")] = 0,
    hung_job: Annotated[bool, typer.Option(help="Report a hung job.")] = False,
    silent: Annotated[bool, typer.Option(help="Stop reporting (heartbeat stops).")] = False,
    load: Annotated[float | None, typer.Option(
        min=0, max=100, help="Hold the GPUs at this utilisation, %.")] = None,
    flap: Annotated[float, typer.Option(
        min=0, help="Alternate reporting and silence every FLAP seconds.")] = 0.0,
    deaf: Annotated[bool, typer.Option(help="Report, but answer no command.")] = False,
) -> None:
    """Inject a fault (or a load) on one agent; it adds to what is already injected."""
    from agent import fleet

    changes: dict[str, object] = {}
    if xid:
        changes["xid"] = list(xid)
    if ecc:
        changes["ecc_uncorrected"] = ecc
    if hung_job:
        changes["hung_job"] = True
    if silent:
        changes["silent"] = True
    if load is not None:
        changes["load_pct"] = load
    if flap:
        changes["flap_s"] = flap
    if deaf:
        changes["ignore_commands"] = True
    fleet.inject_fault(_state_dir(_settings()), node, **changes)
    typer.echo(f"fault injected on {node}")


@fleet_app.command("clear")
def fleet_clear(node: str) -> None:
    """Clear injected faults on one agent."""
    from agent import fleet

    fleet.clear_faults(_state_dir(_settings()), node)
    typer.echo(f"faults cleared on {node}")


@fleet_app.command("kill")
def fleet_kill(node: str) -> None:
    """SIGKILL one agent (a dead node)."""
    from agent import fleet

    fleet.kill_agent(_state_dir(_settings()), node)
    typer.echo(f"killed {node}")


# Shorter holds than in production, so the demo shows every need within a couple of minutes.
DEMO_SETTINGS = {
    # Two standby nodes the local capacity provider can start when the pool runs hot.
    "CAPACITY_LOCAL_STANDBY": "standby-1:2,standby-2:4",
    "ANALYZER_POOL_PERIOD_S": "2",
    "ANALYZER_LOAD_BALANCE__HOLD_S": "10",
    "ANALYZER_SCALE__HOLD_S": "20",
    "ANALYZER_ONLINE__HOLD_S": "20",
}


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(min=2, max=50)] = 3,
    fault_after: Annotated[float, typer.Option(help="Seconds before the first fault.")] = 12.0,
) -> None:
    """Services plus a local fleet, then a scripted day: a GPU fault takes its node offline
    and its jobs run again elsewhere from their checkpoints, a hot node gives a job away, a
    busy pool gets a standby node, and the repaired node returns. Ctrl-C stops everything."""
    from agent import fleet

    settings = _settings()
    state = _state_dir(settings)
    env = _service_env(settings) | DEMO_SETTINGS
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace))
    _, public = ensure_keypair(state / "keys")
    services = launcher.start_services(state, env)
    names = [f"node-{i:03d}" for i in range(1, nodes + 1)]
    for node in names:  # a calm start: every GPU at 40%
        fleet.inject_fault(state, node, load_pct=40.0)
    agents = fleet.fleet_up(nodes, 2, settings.cluster_id, settings.namespace, state, env,
                            [public], 2.0)
    _enrol(settings, [a.node_id for a in agents])
    typer.echo(f"services and {len(agents)} agents running; logs in {state / 'logs'}")
    victim, hot = names[1], names[0]

    def step(text: str) -> None:
        typer.echo(typer.style(f"--- {text} ---", bold=True))

    async def guard() -> None:
        # A demo whose services died would show nothing happening: say so and stop.
        # Child processes have no event to await here, so their table is polled.
        while not (dead := launcher.dead_services(services)):  # noqa: ASYNC110
            await asyncio.sleep(1.0)
        for svc in dead:
            typer.echo(f"{svc.name} exited ({svc.process.returncode}); see {svc.log_path}")
        raise typer.Exit(1)

    async def show() -> None:
        watcher = asyncio.create_task(watch(settings))
        guarding = asyncio.create_task(guard())
        watcher.add_done_callback(lambda _: guarding.cancel())
        guarding.add_done_callback(lambda _: watcher.cancel())
        await asyncio.sleep(fault_after)
        step(f"GPU XID 79 (fallen off the bus) on {victim}")
        fleet.inject_fault(state, victim, xid=[79])
        await asyncio.sleep(15)
        step(f"{hot} runs hot at 92% while the rest of the pool stays at 40%")
        fleet.inject_fault(state, hot, load_pct=92.0)
        await asyncio.sleep(20)
        step("the whole pool holds at 88%")
        for node in names:
            fleet.inject_fault(state, node, load_pct=88.0)
        await asyncio.sleep(35)
        step(f"{victim} repaired: its fault clears")
        fleet.inject_fault(state, victim, xid=[])
        step("watching; Ctrl-C stops everything")
        await asyncio.gather(watcher, guarding)

    previous = signal.getsignal(signal.SIGINT)
    try:
        asyncio.run(show())
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
        fleet.fleet_down(state)
        launcher.stop_services(services)
        signal.signal(signal.SIGINT, previous)


CLI_SOURCE = "warden-cli"
_IDENTIFIER: TypeAdapter[str] = TypeAdapter(Identifier)
_REASON: TypeAdapter[str] = TypeAdapter(Reason)


def _identifier(value: str) -> str:
    """An id as the contract spells ids (letters, digits, `_.-`), or a usage error."""
    try:
        return _IDENTIFIER.validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter(
            f"{value!r}: letters, digits, '_', '.' and '-' only (1-128)") from err


def _optional_identifier(value: str | None) -> str | None:
    return None if value is None else _identifier(value)


def _reason(value: str) -> str:
    try:
        return _REASON.validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter("a reason of 1 to 500 characters is required") from err


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


@breaker_app.command("list")
def breaker_list(
    cluster: Annotated[str | None, typer.Option(
        help="Only this cluster's breakers.", callback=_optional_identifier)] = None,
) -> None:
    """Every breaker's state, per cluster and kind (kind@node with the node scope)."""
    rows = asyncio.run(list_breakers(SchedulerSettings(), cluster))
    if not rows:
        typer.echo("no breaker has recorded an outcome yet (all closed)")
    for row in rows:
        typer.echo(describe_breaker(*row))


@breaker_app.command("reset")
def breaker_reset(
    cluster: Annotated[str, typer.Option(help="The breaker's cluster.", callback=_identifier)],
    kind: Annotated[str, typer.Option(
        help="The task kind (offline, migrate, ...), or kind@node as `list` shows it.")],
    actor: Annotated[str, typer.Option(help="Who resets it (recorded in the audit log).",
                                       callback=_identifier)],
    reason: Annotated[str, typer.Option(help="Why (recorded in the audit log).",
                                        callback=_reason)],
    node: Annotated[str | None, typer.Option(
        help="The node, for node-scoped breakers.", callback=_optional_identifier)] = None,
) -> None:
    """Close a breaker (an admin action): audited, and announced with an info alert."""
    base, _, at = kind.partition(SCOPE_SEPARATOR)
    if at and node and at != node:
        raise typer.BadParameter(f"{kind} names another node than --node {node}",
                                 param_hint="--kind")
    target = node or at
    name = breaker_name(_identifier(base), _identifier(target) if target else "",
                        "node" if target else "cluster")
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
