"""`warden`: run the control plane, a local fleet, and watch what it does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import typer
from aiokafka import AIOKafkaConsumer
from pydantic import SecretStr, TypeAdapter, ValidationError

from agent.ml.serving import STANDARD_MODELS, parse_models
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Identifier, Reason
from schemas.events.v1 import Alert, NodeState, OpsNeed, TaskEvent
from schemas.topics import Topic, topic_name
from services.api.client import ApiClient, ApiError, ClientSettings
from services.scheduler.breaker import SCOPE_SEPARATOR, BreakerState, breaker_named
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
from warden import launcher

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


def _api_url() -> str:
    from services.api.settings import ApiSettings

    api = ApiSettings()
    return f"http://{api.host}:{api.port}"


LOCAL_TOKENS_FILE = "api-tokens"
LOCAL_ADMIN = "local-admin"


def local_tokens_file(settings: ServiceSettings) -> Path:
    """The token file `warden up` makes for a local API when none is configured."""
    return _state_dir(settings) / "keys" / LOCAL_TOKENS_FILE


def _api_env(settings: ServiceSettings) -> dict[str, str]:
    """What the API (and the templater) need beside the shared settings.

    Without API_TOKENS or API_TOKENS_FILE every call would be refused, so a local admin token
    is made once in the state folder (readable by its owner only), where `warden tasks ...`
    finds it too; the templater is pointed at the template folder the API edits.
    """
    from services.api.auth import new_token
    from services.api.templates import templater_env

    env = templater_env(os.environ.get("TEMPLATER_TEMPLATE_DIR", ""), str(_state_dir(settings)))
    if not (os.environ.get("API_TOKENS") or os.environ.get("API_TOKENS_FILE")):
        path = local_tokens_file(settings)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"# made by `warden up`: the local admin's token\n"
                          f"{new_token()}:{LOCAL_ADMIN}:admin\n")
        env["API_TOKENS_FILE"] = str(path)
    return env


@app.command()
def up() -> None:
    """Run every control-plane service and the API, each in its own process, until Ctrl-C."""
    settings = _settings()
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace))
    services = launcher.start_services(_state_dir(settings),
                                       _service_env(settings) | _api_env(settings),
                                       launcher.PROCESSES)
    typer.echo("services: " + ", ".join(f"{s.name} (pid {s.process.pid})" for s in services))
    typer.echo(f"API and console: {_api_url()}")
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
    models: Annotated[str, typer.Option(
        help="ML models each agent serves for routed tasks (name@version,...; '' none).")
    ] = ",".join(STANDARD_MODELS),
) -> None:
    """Start NODES local agent processes."""
    from agent import fleet

    settings = _settings()
    state = _state_dir(settings)
    _, public = ensure_keypair(state / "keys")
    try:
        parse_models(models)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--models") from err
    agents = fleet.fleet_up(nodes, gpus, settings.cluster_id, settings.namespace, state,
                            _service_env(settings), [public], interval, first=first, jobs=jobs,
                            models=models)
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
    flaky_model: Annotated[str | None, typer.Option(
        help="Make a served model (name or name@version) fail some tasks: its output turns "
             "to NaN (a model fault).")] = None,
    failing_node: Annotated[bool, typer.Option(
        help="Make every served model fail some tasks with a device error (a node fault).")
    ] = False,
    failure_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of tasks the flaky model or failing node fails.")] = 1.0,
    slow_ms: Annotated[float, typer.Option(
        min=0.0, help="Add this latency to the flaky model's (or the node's) answers.")] = 0.0,
) -> None:
    """Inject a fault (or a load) on one agent; it adds to what is already injected."""
    from agent import fleet
    from agent.faults import ModelFault, read_faults

    changes: dict[str, object] = {}
    if flaky_model is not None or failing_node:
        fault = ModelFault(model=flaky_model, failure_rate=failure_rate,
                           cause="node_fault" if failing_node else "model_fault",
                           latency_ms=slow_ms)
        current = read_faults(fleet.agent_dir(_state_dir(_settings()), node)).model_faults
        changes["model_faults"] = [f.model_dump() for f in (fault, *current)]
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
    busy pool gets a standby node, and the repaired node returns. All along, ML tasks flow
    through the API, with a table of where they ran every 10 s; one model turns flaky on one
    node for a while and the router moves its traffic away. Ctrl-C stops everything."""
    from agent import fleet
    from warden import demo_ml

    settings = _settings()
    state = _state_dir(settings)
    env = _service_env(settings) | _api_env(settings) | DEMO_SETTINGS
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace))
    _, public = ensure_keypair(state / "keys")
    services = launcher.start_services(state, env, launcher.PROCESSES)
    names = [f"node-{i:03d}" for i in range(1, nodes + 1)]
    for node in names:  # a calm start: every GPU at 40%
        fleet.inject_fault(state, node, load_pct=40.0)
    # The agents also serve the standard models: `warden submit --digit 3 --wait` routes.
    agents = fleet.fleet_up(nodes, 2, settings.cluster_id, settings.namespace, state, env,
                            [public], 2.0, models=",".join(STANDARD_MODELS))
    _enrol(settings, [a.node_id for a in agents])
    typer.echo(f"services and {len(agents)} agents running; logs in {state / 'logs'}; "
               f"console at {_api_url()}")
    victim, hot = names[1], names[0]
    spare = [n for n in names if n != victim]  # the ML fault goes there, to be seen on its own
    os.environ["WARDEN_API_URL"] = _api_url()  # ML tasks go to the API this demo started

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
        ml = asyncio.create_task(demo_ml.run(api_client, state, STANDARD_MODELS, names, spare,
                                             fault_after, step))
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
        await asyncio.gather(watcher, guarding, ml)

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
    try:
        name = breaker_named(kind, node)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--kind") from err
    base, _, target = name.partition(SCOPE_SEPARATOR)
    _identifier(base)
    if target:
        _identifier(target)
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


# ------------------------------------------------------------------ tasks, nodes, templates

tasks_app = typer.Typer(help="Ops tasks: list, show and intervene (through the API).",
                        no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
templates_app = typer.Typer(help="Task templates: list, show, validate, save (through the API).",
                            no_args_is_help=True)
app.add_typer(templates_app, name="templates")
api_app = typer.Typer(help="Run the operators' HTTP API and web console (no subcommand), or "
                           "make a token for it (`token`).")
app.add_typer(api_app, name="api")

FINAL_TASK_STATES = frozenset({"succeeded", "failed", "terminated"})
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
WaitOption = Annotated[bool, typer.Option(
    "--wait", help="Follow the task, printing each transition, until it settles.")]
TimeoutOption = Annotated[float, typer.Option(min=1.0, help="Give up waiting after this, s.")]
ReasonOption = Annotated[str, typer.Option(help="Why (recorded with the control and in the "
                                                "audit log).", callback=_reason)]


def api_client() -> ApiClient:
    """The API client of WARDEN_API_URL and WARDEN_API_TOKEN (replaced in tests).

    Without WARDEN_API_TOKEN, the local admin token `warden up` made is used, if there is one.
    """
    client = ClientSettings()
    if not client.token.get_secret_value():
        local = local_tokens_file(_settings())
        if local.exists():
            entries = [line for line in local.read_text().splitlines()
                       if line.strip() and not line.startswith("#")]
            if entries:
                client = client.model_copy(
                    update={"token": SecretStr(entries[0].partition(":")[0])})
    return ApiClient(client)


def _fail(err: ApiError) -> typer.Exit:
    typer.echo(f"error ({err.status}): {err}" if err.status else f"error: {err}", err=True)
    return typer.Exit(1)


def _print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def table(headers: list[str], rows: list[list[str]], max_width: int = 60) -> str:
    """A plain-text table: one header line, one line per row, columns padded to fit."""
    cells = [[c if len(c) <= max_width else c[:max_width - 1] + "~" for c in row]
             for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


def when(value: object) -> str:
    """An API time (ISO, UTC) as `YYYY-MM-DD HH:MM:SS`; '-' for none."""
    if not isinstance(value, str) or not value:
        return "-"
    return value.replace("T", " ")[:19]


def _text(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def step_of(task: Mapping[str, Any]) -> str:
    """`current/total` steps (1-based), as far as they are known."""
    total, current = task.get("step_count"), task.get("current_step")
    if total is None:
        return "-"
    return f"{(current + 1) if current is not None else 0}/{total}"


def tasks_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return table(["TASK", "STATE", "KIND", "TARGET", "STEP", "TEMPLATE", "UPDATED", "REASON"],
                 [[str(r["task_id"]), r["state"], _text(r.get("kind") or r.get("need_kind")),
                   _text(r.get("target")), step_of(r), _text(r.get("template")),
                   when(r.get("updated_at")), _text(r.get("reason"))] for r in rows])


def resources(outputs: Mapping[str, Any]) -> str:
    """`initial -> target` of a capacity change a step recorded (empty if none)."""
    if "initial_nodes" not in outputs or "target_nodes" not in outputs:
        return ""

    def side(prefix: str) -> str:
        util = outputs.get(f"{prefix}_util_pct")
        shown = f" at {util:g}%" if isinstance(util, int | float) else ""
        return f"{outputs[f'{prefix}_nodes']} nodes{shown}"

    return f"{side('initial')} -> {side('target')}"


def describe_task(task: Mapping[str, Any]) -> str:
    """`warden tasks show`: the task, its evidence, steps, children and transitions."""
    parent = task.get("parent_task_id")
    lines = [
        f"task      {task['task_id']}" + (f"  (child of {parent})" if parent else ""),
        f"state     {task['state']}  {_text(task.get('reason'))}",
        f"kind      {_text(task.get('kind'))} (need {_text(task.get('need_kind'))}), template "
        f"{_text(task.get('template'))}, priority {_text(task.get('priority'))}"
        + ("  DRY RUN" if task.get("dry_run") else ""),
        f"where     cluster {task['cluster_id']}, pool {_text(task.get('pool'))}, target "
        f"{_text(task.get('target'))}",
        f"times     created {when(task.get('created_at'))}, updated "
        f"{when(task.get('updated_at'))}, finished {when(task.get('finished_at'))}",
    ]
    evidence = task.get("evidence") or []
    if evidence:
        lines.append("evidence")
        for ev in evidence:
            lines.append(f"  {ev.get('metric')}={ev.get('value')} outside "
                         f"[{ev.get('range_low')}, {ev.get('range_high')}] "
                         f"{ev.get('detail', '')}".rstrip())
    steps = task.get("steps") or []
    if steps:
        lines += ["", table(
            ["#", "STEP", "ACTION", "GUARD", "STATE", "TRIES", "COMMAND", "RESULT"],
            [[str(s["index"]), _text(s.get("name")), _text(s.get("action")),
              _text(s.get("guard")), s["state"], str(s.get("attempts", 0)),
              str(s["command_id"])[:8] if s.get("command_id") else "-",
              resources(s.get("outputs") or {}) or _text(s.get("reason"))]
             for s in steps], max_width=70)]
    children = task.get("children") or []
    if children:
        lines += ["", "children", tasks_table(children)]
    transitions = task.get("transitions") or []
    if transitions:
        lines += ["", table(["AT", "STATE", "STEP", "ACTOR", "REASON"],
                            [[when(t.get("occurred_at")), t["state"], transition_step(t),
                              t["actor"], _text(t.get("reason"))] for t in transitions],
                            max_width=80)]
    return "\n".join(lines)


def transition_step(t: Mapping[str, Any]) -> str:
    if t.get("step_index") is None:
        return "-"
    return f"{t['step_index']} {t.get('step_state') or ''}".rstrip()


def transition_line(t: Mapping[str, Any]) -> str:
    """One line per transition while following a task."""
    step = f" step {transition_step(t)}" if t.get("step_index") is not None else ""
    return f"{when(t.get('occurred_at'))[11:]}  {t['state']}{step}  {t['actor']}: " \
           f"{_text(t.get('reason'))}"


def follow(client: ApiClient, task_id: UUID, done: Callable[[Mapping[str, Any]], bool],
           timeout_s: float, poll_s: float = 1.0, seen: int | None = None) -> Mapping[str, Any]:
    """Print the task's transitions as they are recorded until `done(task)` or timeout."""
    deadline = time.monotonic() + timeout_s
    task = client.task(task_id)
    shown = len(task.get("transitions") or []) if seen is None else seen
    while True:
        transitions = task.get("transitions") or []
        for t in transitions[shown:]:
            typer.echo(transition_line(t))
        shown = len(transitions)
        if done(task):
            return task
        if time.monotonic() >= deadline:
            typer.echo(f"still {task['state']} after {timeout_s:g}s; stopped waiting", err=True)
            raise typer.Exit(2)
        time.sleep(poll_s)
        task = client.task(task_id)


def _refusal(action: str, since: int) -> Callable[[Mapping[str, Any]], bool]:
    """True once the executor recorded a refusal of `action` after transition `since`."""
    def refused(task: Mapping[str, Any]) -> bool:
        return any((t.get("outputs") or {}).get("refused")
                   and (t.get("outputs") or {}).get("control") == action
                   for t in (task.get("transitions") or [])[since:])
    return refused


@tasks_app.command("list")
def tasks_list(
    node: Annotated[str | None, typer.Option(help="Tasks on this node (target or a step's).",
                                             callback=_optional_identifier)] = None,
    cluster: Annotated[str | None, typer.Option(callback=_optional_identifier)] = None,
    state: Annotated[str | None, typer.Option(help="created, queued, dispatched, running, "
                                              "paused, succeeded, failed, terminated")] = None,
    kind: Annotated[str | None, typer.Option(help="Need kind or task kind.",
                                             callback=_optional_identifier)] = None,
    parent: Annotated[UUID | None, typer.Option(help="Children of this task.")] = None,
    since: Annotated[str | None, typer.Option(help="Active since (ISO time, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Created before (ISO time, UTC).")] = None,
    top_level: Annotated[bool, typer.Option(help="Only tasks without a parent.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: JsonOption = False,
) -> None:
    """Tasks, newest first, filtered."""
    try:
        with api_client() as client:
            page = client.tasks(node=node, cluster=cluster, state=state, kind=kind,
                                parent=str(parent) if parent else None, since=since,
                                until=until, top_level=top_level or None, limit=limit,
                                offset=offset)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(page)
        return
    if not page["items"]:
        typer.echo("no task matches")
        return
    typer.echo(tasks_table(page["items"]))
    shown = offset + len(page["items"])
    if shown < page["total"]:
        typer.echo(f"({len(page['items'])} of {page['total']}; --offset {shown} for more)")


@tasks_app.command("show")
def tasks_show(task_id: UUID, as_json: JsonOption = False, wait: WaitOption = False,
               timeout: TimeoutOption = 600.0) -> None:
    """A task with its evidence, steps, children and transitions."""
    try:
        with api_client() as client:
            task = client.task(task_id)
            if as_json:
                _print_json(task)
            else:
                typer.echo(describe_task(task))
            if wait and task["state"] not in FINAL_TASK_STATES:
                follow(client, task_id, lambda t: t["state"] in FINAL_TASK_STATES, timeout)
    except ApiError as err:
        raise _fail(err) from err


def _control(task_id: UUID, action: str, reason: str, step: int | None, wait: bool,
             timeout: float, as_json: bool) -> None:
    try:
        with api_client() as client:
            before = len(client.task(task_id).get("transitions") or []) if wait else 0
            accepted = client.control(task_id, action, reason, step)
            if as_json:
                _print_json(accepted)
            else:
                typer.echo(f"{action} of task {task_id} accepted (control "
                           f"{accepted['control_event_id']}): expect "
                           f"{accepted['expected_state']}; {accepted['note']}")
            if not wait:
                return
            expected = accepted["expected_state"]
            refused = _refusal(action, before)
            task = follow(client, task_id,
                          lambda t: t["state"] == expected or refused(t)
                          or t["state"] in FINAL_TASK_STATES, timeout, seen=before)
    except ApiError as err:
        raise _fail(err) from err
    if refused(task) or task["state"] != expected:
        typer.echo(f"the task is {task['state']}: the {action} did not take effect", err=True)
        raise typer.Exit(1)


def _control_command(action: str, doc: str) -> None:
    def command(task_id: UUID, reason: ReasonOption, wait: WaitOption = False,
                timeout: TimeoutOption = 300.0, as_json: JsonOption = False) -> None:
        _control(task_id, action, reason, None, wait, timeout, as_json)

    command.__doc__ = doc
    tasks_app.command(action)(command)


_control_command("pause", "Pause a task at its next step boundary (operator).")
_control_command("resume", "Resume a paused task (operator).")
_control_command("retry", "Retry a failed task from its failed step (operator).")
_control_command("terminate", "Terminate a task; a running command is cancelled (operator).")


@tasks_app.command("jump")
def tasks_jump(task_id: UUID,
               step: Annotated[int, typer.Option(min=0, max=63, help="The step (0-based).")],
               reason: ReasonOption, wait: WaitOption = False, timeout: TimeoutOption = 300.0,
               as_json: JsonOption = False) -> None:
    """Move a paused or failed task to a step, paused there; resume runs it (admin)."""
    _control(task_id, "jump", reason, step, wait, timeout, as_json)


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    def util(value: object) -> str:
        return f"{value:.1f}" if isinstance(value, int | float) else "-"

    return table(
        ["CLUSTER", "NODE", "POOL", "STATE", "MODE", "UTIL%", "GPUS", "JOBS", "FAULTS",
         "LAST REPORT"],
        [[n["cluster"], n["node_id"], _text(n.get("pool")), n["state"], _text(n.get("mode")),
          util(n.get("util_pct")), _text(n.get("gpus")),
          ",".join(f"{j['job_id']}:{j['state']}" for j in n.get("jobs") or [])
          or str(n.get("job_count", 0)),
          str(n.get("fault_count", 0)), when(n.get("last_report_at"))] for n in nodes])


@app.command()
def nodes(
    cluster: Annotated[str | None, typer.Option(help="Only this cluster's nodes.",
                                                callback=_optional_identifier)] = None,
    as_json: JsonOption = False,
) -> None:
    """Every node: state, mode, GPU utilisation, jobs (through the API)."""
    try:
        with api_client() as client:
            found = client.nodes(cluster)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(found)
    elif not found:
        typer.echo("no node has reported or been enrolled")
    else:
        typer.echo(nodes_table(found))


@templates_app.command("list")
def templates_list(as_json: JsonOption = False) -> None:
    """Every template and the need it serves (a broken file says why)."""
    try:
        with api_client() as client:
            found = client.templates()
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(found)
        return
    typer.echo(table(["NAME", "VERSION", "NEED", "PRIORITY", "STEPS", "FILE", "DESCRIPTION"],
                     [[t["name"], _text(t.get("version")), _text(t.get("need")),
                       _text(t.get("priority")), str(t.get("steps", 0)), t["file"],
                       f"BROKEN: {t['error']}" if t.get("error") else t.get("description", "")]
                      for t in found], max_width=70))


@templates_app.command("show")
def templates_show(name: str, as_json: JsonOption = False) -> None:
    """One template's YAML (or, with --json, its parsed form too)."""
    try:
        with api_client() as client:
            found = client.template(name)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(found)
        return
    typer.echo(f"# {found['file']} (sha256 {found['sha256'][:12]})")
    if found.get("error"):
        typer.echo(f"# BROKEN: {found['error']}")
    typer.echo(found["yaml"].rstrip("\n"))


def _problems(err: ApiError) -> list[str]:
    detail = err.body.get("detail") if isinstance(err.body, dict) else None
    if isinstance(detail, dict):
        return [f"{p['field']}: {p['message']}" for p in detail.get("problems", [])]
    return []


@templates_app.command("validate")
def templates_validate(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    as_json: JsonOption = False,
) -> None:
    """Check a template file with the templater's rules, against the saved ones (operator)."""
    try:
        with api_client() as client:
            checked = client.validate_template(file.read_text())
    except ApiError as err:
        if err.status != 422:
            raise _fail(err) from err
        if as_json:
            _print_json(err.body)
        else:
            typer.echo(f"{file.name}: invalid")
            for line in _problems(err) or [str(err)]:
                typer.echo(f"  {line}")
        raise typer.Exit(1) from err
    if as_json:
        _print_json(checked)
    else:
        template = checked["template"]
        typer.echo(f"{file.name}: valid ({template['name']}.v{template['version']} for need "
                   f"{template['need']}, {len(template['steps'])} steps)")


@templates_app.command("save")
def templates_save(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    reason: ReasonOption,
    name: Annotated[str | None, typer.Option(
        help="The template's name; default: the file's name without .yaml.")] = None,
) -> None:
    """Validate and save a template (admin); the templater uses it from its next start."""
    target = name or file.stem
    try:
        with api_client() as client:
            saved = client.save_template(target, file.read_text(), reason)
    except ApiError as err:
        typer.echo(f"{file.name}: not saved", err=True)
        for line in _problems(err) or [str(err)]:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"{saved['file']}: {'saved' if saved['saved'] else 'unchanged'}; "
               f"{saved['note']}")


@api_app.callback(invoke_without_command=True)
def api_serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65_535,
                                             help="Port (API_PORT, 18080).")] = None,
) -> None:
    """Run the API and the web console (uvicorn) until Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    from services.api.app import serve
    from services.api.settings import ApiSettings

    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = ApiSettings().model_copy(update=overrides)
    with contextlib.suppress(KeyboardInterrupt):
        serve(settings)


@api_app.command("token")
def api_token(
    user: Annotated[str, typer.Option(help="Who the token is for (named in the audit log).",
                                      callback=_identifier)],
    role: Annotated[str, typer.Option(help="viewer, operator or admin.")],
) -> None:
    """Make a new random token and print the entry that grants it."""
    from services.api.auth import ROLES, new_token, token_lines

    if role not in ROLES:
        raise typer.BadParameter(f"one of {', '.join(ROLES)}", param_hint="--role")
    token = new_token()
    plain, hashed = token_lines(token, user, role)
    typer.echo(f"token: {token}")
    typer.echo(f"add to API_TOKENS (comma-separated) or a line of API_TOKENS_FILE:\n  {plain}")
    typer.echo(f"or keep only its digest on the server:\n  {hashed}")
    typer.echo("the caller sets WARDEN_API_TOKEN to the token")


def main() -> None:
    app()


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------ ML tasks (issue 6)

ml_app = typer.Typer(help="ML tasks and the models that run them (through the API).",
                     no_args_is_help=True)
app.add_typer(ml_app, name="ml")
FINAL_ML_STATES = frozenset({"succeeded", "failed"})


def held_out_digit(index: int) -> list[float]:
    """The index-th held-out digit of the data set, as a digits task's input (0..16)."""
    from agent.ml.data import PIXEL_MAX, digits, split

    _, _, x_test, _ = split(*digits())
    return [float(round(v * PIXEL_MAX)) for v in x_test[index % len(x_test)]]


def parse_input(text: str) -> list[float]:
    """Numbers separated by commas or blanks."""
    try:
        return [float(part) for part in text.replace(",", " ").split()]
    except ValueError as err:
        raise typer.BadParameter("numbers separated by commas or blanks",
                                 param_hint="--input") from err


def attempt_line(attempt: Mapping[str, Any]) -> str:
    """One attempt: where it ran, the decision, how it ended."""
    where = (f"{attempt.get('model')}:{attempt.get('version')} on {attempt.get('node_id')}"
             if attempt.get("node_id") else f"nothing chosen ({attempt.get('status')})")
    if attempt.get("outcome") == "succeeded":
        end = f"-> {attempt.get('prediction')} ({_text(attempt.get('latency_ms'))} ms)"
    elif attempt.get("outcome") == "failed":
        end = f"-> failed: {attempt.get('cause')} (against {attempt.get('attributed_to')})"
    else:
        end = "-> in flight"
    return f"  attempt {attempt['attempt']}: {where} [{attempt.get('status')}] {end}"


def describe_ml_task(task: Mapping[str, Any], candidates: bool = False) -> str:
    """`warden ml show`: the task, its attempts and (with --candidates) every decision."""
    lines = [
        f"task      {task['task_id']}  ({task.get('task_type')}, priority "
        f"{_text(task.get('priority'))}{', critical' if task.get('critical') else ''}, by "
        f"{_text(task.get('submitted_by'))})",
        f"state     {task['state']}  {_text(task.get('reason'))}",
        f"answer    {_text(task.get('prediction'))} (confidence "
        f"{_text(task.get('confidence'))}) by {_text(task.get('model'))}:"
        f"{_text(task.get('version'))} on {_text(task.get('node_id'))}, "
        f"{_text(task.get('latency_ms'))} ms",
        f"times     created {when(task.get('created_at'))}, deadline "
        f"{when(task.get('deadline'))}, finished {when(task.get('finished_at'))}",
    ]
    for attempt in task.get("attempt_list") or []:
        lines.append(attempt_line(attempt))
        if attempt.get("decision_reason"):
            lines.append(f"    decision: {attempt['decision_reason']}")
        if candidates:
            lines.append(table(
                ["    ARM", "STATE", "ELIGIBLE", "MEAN", "N", "INFLIGHT", "SCORE", "REASON"],
                [[f"    {c['arm']}", c["state"], "yes" if c["eligible"] else "no",
                  f"{c['mean']:.3f}", f"{c['n_eff']:.1f}", f"{c['inflight']}/{c['limit']}",
                  f"{c['score']:.3f}" if c.get("score") is not None else "-", c["reason"]]
                 for c in attempt.get("candidates") or []], max_width=70))
    return "\n".join(lines)


def ml_tasks_table(rows: Sequence[Mapping[str, Any]]) -> str:
    return table(["TASK", "STATE", "TYPE", "MODEL", "NODE", "TRIES", "ANSWER", "CAUSE",
                  "CREATED"],
                 [[str(r["task_id"]), r["state"], _text(r.get("task_type")),
                   f"{r['model']}:{r['version']}" if r.get("model") else "-",
                   _text(r.get("node_id")), str(r.get("attempts", 0)),
                   _text(r.get("prediction")), _text(r.get("cause")),
                   when(r.get("created_at"))] for r in rows])


@app.command()
def submit(
    task_type: Annotated[str, typer.Option("--type", help="The task type (e.g. digits).",
                                           callback=_identifier)] = "digits",
    digit: Annotated[int | None, typer.Option(
        min=0, help="Send the N-th held-out digit of the data set (a digits task).")] = None,
    values: Annotated[str | None, typer.Option(
        "--input", help="The input: numbers separated by commas or blanks.")] = None,
    deadline: Annotated[float, typer.Option(min=0.001, max=3_600.0,
                                            help="Seconds it must be done in.")] = 10.0,
    priority: Annotated[int, typer.Option(min=0, max=9, help="0 is the most urgent.")] = 5,
    critical: Annotated[bool, typer.Option(
        help="Choose the model by a pessimistic bound, not a sample.")] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the task until it succeeds or fails.")] = False,
    timeout: TimeoutOption = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Submit an ML task (operator); the router chooses the model, version and node."""
    if (digit is None) == (values is None):
        raise typer.BadParameter("give exactly one of --digit and --input")
    payload = held_out_digit(digit) if digit is not None else parse_input(values or "")
    try:
        with api_client() as client:
            accepted = client.submit_ml(task_type, payload, deadline, priority, critical)
            task_id = UUID(accepted["task_id"])
            if not wait:
                if as_json:
                    _print_json(accepted)
                else:
                    typer.echo(f"submitted ML task {task_id} (deadline "
                               f"{when(accepted['deadline'])})")
                return
            task = follow_ml(client, task_id, timeout, quiet=as_json)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(task)
    if task["state"] != "succeeded":
        raise typer.Exit(1)


def follow_ml(client: ApiClient, task_id: UUID, timeout_s: float, poll_s: float = 0.25,
              quiet: bool = False) -> Mapping[str, Any]:
    """Print each attempt as it ends, until the task is final (exit 2 on timeout)."""
    deadline = time.monotonic() + timeout_s
    shown: set[tuple[int, str | None]] = set()
    if not quiet:
        typer.echo(f"submitted ML task {task_id}")
    while True:
        try:
            task = client.ml_task(task_id)
        except ApiError as err:
            if err.status != 404:  # not recorded yet
                raise
            task = {"state": "submitted", "attempt_list": []}
        for attempt in task.get("attempt_list") or []:
            key = (attempt["attempt"], attempt.get("outcome"))
            if key not in shown and (attempt.get("outcome") or attempt.get("node_id")):
                shown.add(key)
                if not quiet:
                    typer.echo(attempt_line(attempt))
        if task["state"] in FINAL_ML_STATES:
            if not quiet:
                typer.echo(f"{task['state']}: {_text(task.get('reason'))}")
            return task
        if time.monotonic() >= deadline:
            typer.echo(f"still {task['state']} after {timeout_s:g}s; stopped waiting", err=True)
            raise typer.Exit(2)
        time.sleep(poll_s)


@ml_app.command("list")
def ml_list(
    state: Annotated[str | None, typer.Option(
        help="submitted, running, succeeded, failed")] = None,
    task_type: Annotated[str | None, typer.Option("--type",
                                                  callback=_optional_identifier)] = None,
    node: Annotated[str | None, typer.Option(help="Any attempt ran there.",
                                             callback=_optional_identifier)] = None,
    model: Annotated[str | None, typer.Option(help="Any attempt used it.",
                                              callback=_optional_identifier)] = None,
    cluster: Annotated[str | None, typer.Option(callback=_optional_identifier)] = None,
    since: Annotated[str | None, typer.Option(help="Active since (ISO time, UTC).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: JsonOption = False,
) -> None:
    """ML tasks, newest first, filtered."""
    try:
        with api_client() as client:
            page = client.ml_tasks(state=state, task_type=task_type, node=node, model=model,
                                   cluster=cluster, since=since, limit=limit, offset=offset)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(page)
    elif not page["items"]:
        typer.echo("no ML task matches")
    else:
        typer.echo(ml_tasks_table(page["items"]))


@ml_app.command("show")
def ml_show(task_id: UUID, candidates: Annotated[bool, typer.Option(
        help="Also every candidate of every decision: statistics, eligibility, why.")] = False,
            as_json: JsonOption = False) -> None:
    """An ML task: its answer, its attempts and the decisions behind them."""
    try:
        with api_client() as client:
            task = client.ml_task(task_id)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(task)
    else:
        typer.echo(describe_ml_task(task, candidates))


@ml_app.command("models")
def ml_models(
    cluster: Annotated[str | None, typer.Option(callback=_optional_identifier)] = None,
    task_type: Annotated[str | None, typer.Option("--type",
                                                  callback=_optional_identifier)] = None,
    as_json: JsonOption = False,
) -> None:
    """Which model versions each node serves, and how each is doing (live)."""
    try:
        with api_client() as client:
            view = client.ml_models(cluster, task_type)
    except ApiError as err:
        raise _fail(err) from err
    if as_json:
        _print_json(view)
        return
    if not view["arms"]:
        typer.echo("no node reports a served model")
        return
    typer.echo(table(
        ["NODE", "TYPE", "MODEL", "FAMILY", "STATE", "READY", "QUARANTINE", "MEAN", "N",
         "INFLIGHT", "LATENCY MS"],
        [[a["node_id"], a["task_type"], f"{a['model']}:{a['version']}", a["family"],
          a["model_state"], "yes" if a["ready"] else "no",
          a["quarantine"] + (f" until {when(a['quarantined_until'])[11:]}"
                             if a.get("quarantined_until") else ""),
          f"{a['mean']:.3f}", f"{a['n_eff']:.1f}", str(a["inflight"]),
          _text(a.get("latency_ms"))] for a in view["arms"]]))
