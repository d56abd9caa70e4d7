"""`warden demo`: the services, a local fleet and a scripted day of faults and load."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Annotated

import typer

from agent.ml.serving import STANDARD_MODELS
from common.kafka_access import client_options
from common.messaging import ensure_topics
from common.signing import ensure_signer_keys
from warden import launcher
from warden.cli import common
from warden.cli.common import api_url, enrol, service_env, service_settings, state_dir
from warden.cli.events import watch
from warden.cli.local import api_env

# Shorter holds than in production, so the demo shows every need within a couple of minutes.
DEMO_SETTINGS = {
    # Two standby nodes the local capacity provider can start when the pool runs hot.
    "CAPACITY_LOCAL_STANDBY": "standby-1:2,standby-2:4",
    "ANALYZER_POOL_PERIOD_S": "2",
    "ANALYZER_LOAD_BALANCE__HOLD_S": "10",
    "ANALYZER_SCALE__HOLD_S": "20",
    "ANALYZER_ONLINE__HOLD_S": "20",
}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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

    settings = service_settings()
    state = state_dir(settings)
    env = service_env(settings) | api_env(settings) | DEMO_SETTINGS
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace,
                              security=client_options(settings)))
    trusted = ensure_signer_keys(state / "keys")
    services = launcher.start_services(state, env, launcher.PROCESSES)
    names = [f"node-{i:03d}" for i in range(1, nodes + 1)]
    for node in names:  # a calm start: every GPU at 40%
        fleet.inject_fault(state, node, load_pct=40.0)
    # The agents also serve the standard models: `warden submit --digit 3 --wait` routes.
    agents = fleet.fleet_up(nodes, 2, settings.cluster_id, settings.namespace, state, env,
                            trusted, 2.0, models=",".join(STANDARD_MODELS))
    enrol(settings, [a.node_id for a in agents])
    typer.echo(f"services and {len(agents)} agents running; logs in {state / 'logs'}; "
               f"console at {api_url()}")
    victim, hot = names[1], names[0]
    spare = [n for n in names if n != victim]  # the ML fault goes there, to be seen on its own
    os.environ["WARDEN_API_URL"] = api_url()  # ML tasks go to the API this demo started

    def step(text: str) -> None:
        typer.echo(typer.style(f"--- {text} ---", bold=True))

    async def guard() -> None:
        # A demo whose services died would show nothing happening: say so and stop.
        # Child processes have no event to await here, so their table is polled.
        while not (dead := launcher.dead_services(services)):  # noqa: ASYNC110
            await asyncio.sleep(1.0)
        for svc in dead:
            typer.echo(f"{svc.name} exited ({svc.process.returncode}); see {svc.log_path}")
        raise typer.Exit(common.EXIT_FAILED)

    async def show() -> None:
        watcher = asyncio.create_task(watch(settings))
        guarding = asyncio.create_task(guard())
        watcher.add_done_callback(lambda _: guarding.cancel())
        guarding.add_done_callback(lambda _: watcher.cancel())
        ml = asyncio.create_task(demo_ml.run(common.api_client, state, STANDARD_MODELS, names,
                                             spare, fault_after, step))
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
    # SIGTERM (`timeout make demo`, a closed terminal, a supervisor) stops the demo the way
    # Ctrl-C does: through the cleanup below, so no service or agent is left running.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        asyncio.run(show())
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
        fleet.fleet_down(state)
        launcher.stop_services(services)
        signal.signal(signal.SIGINT, previous)
