"""`warden fleet`: a local fleet of agent processes, and faults injected into them."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.ml.serving import STANDARD_MODELS, parse_models
from common.signing import ensure_signer_keys
from warden.cli.common import enrol, service_env, service_settings, state_dir

app = typer.Typer(help="A local fleet of agent processes.", no_args_is_help=True)


@app.command("up")
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

    settings = service_settings()
    state = state_dir(settings)
    trusted = ensure_signer_keys(state / "keys")
    try:
        parse_models(models)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--models") from err
    agents = fleet.fleet_up(nodes, gpus, settings.cluster_id, settings.namespace, state,
                            service_env(settings), trusted, interval, first=first, jobs=jobs,
                            models=models)
    enrol(settings, [a.node_id for a in agents])
    typer.echo(f"started {len(agents)} agents: " + ", ".join(a.node_id for a in agents))


@app.command("down")
def fleet_down() -> None:
    """Stop every local agent."""
    from agent import fleet

    fleet.fleet_down(state_dir(service_settings()))
    typer.echo("fleet stopped")


@app.command("fault")
def fleet_fault(
    node: str,
    xid: Annotated[list[int] | None, typer.Option(help="Inject a GPU XID event.")] = None,
    ecc: Annotated[int, typer.Option(help="Uncorrected ECC errors.")] = 0,
    hung_job: Annotated[bool, typer.Option(help="Report a hung job.")] = False,
    silent: Annotated[bool, typer.Option(
        help="Stop reporting (heartbeat stops) while peers still reach it: a dead agent on a "
             "live node.")] = False,
    partition: Annotated[bool, typer.Option(
        help="Cut the node off from its peers (their probes and its own fail).")] = False,
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
        current = read_faults(fleet.agent_dir(state_dir(service_settings()), node)).model_faults
        changes["model_faults"] = [f.model_dump() for f in (fault, *current)]
    if xid:
        changes["xid"] = list(xid)
    if ecc:
        changes["ecc_uncorrected"] = ecc
    if hung_job:
        changes["hung_job"] = True
    if silent:
        changes["silent"] = True
    if partition:
        changes["partitioned"] = True
    if load is not None:
        changes["load_pct"] = load
    if flap:
        changes["flap_s"] = flap
    if deaf:
        changes["ignore_commands"] = True
    fleet.inject_fault(state_dir(service_settings()), node, **changes)
    typer.echo(f"fault injected on {node}")


@app.command("clear")
def fleet_clear(node: str) -> None:
    """Clear injected faults on one agent."""
    from agent import fleet

    fleet.clear_faults(state_dir(service_settings()), node)
    typer.echo(f"faults cleared on {node}")


@app.command("kill")
def fleet_kill(node: str) -> None:
    """SIGKILL one agent (a dead node)."""
    from agent import fleet

    fleet.kill_agent(state_dir(service_settings()), node)
    typer.echo(f"killed {node}")
