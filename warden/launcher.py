"""Starts and stops the control-plane services as separate processes (one per service)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The order services start in: consumers of a topic before its producers is not needed
# (consumers read from the earliest offset), so this is simply the order of the loop.
SERVICES: tuple[str, ...] = ("collector", "analyzer", "templater", "scheduler", "executor",
                             "store", "router", "alerts", "tuner", "inventory")


# The operators' API runs under uvicorn, not FastStream. `warden up` and the demo start it with
# the services (PROCESSES); tests and benchmarks keep starting only the services they name.
API = "api"
PROCESSES: tuple[str, ...] = (*SERVICES, API)


# With a base port, each process serves its metrics (WARDEN_METRICS_PORT) on the base plus its
# place in PROCESSES: processes of one machine cannot share a port, and
# deploy/local/prometheus.sh scrapes them where this puts them.
METRICS_BASE_PORT = "WARDEN_METRICS_BASE_PORT"


def metrics_env(name: str, env: Mapping[str, str]) -> dict[str, str]:
    """WARDEN_METRICS_PORT of process `name` under WARDEN_METRICS_BASE_PORT (from `env`, else
    the environment); nothing without one (or with 0)."""
    base = int(env.get(METRICS_BASE_PORT) or os.environ.get(METRICS_BASE_PORT) or 0)
    if not base or name not in PROCESSES:
        return {}
    return {"WARDEN_METRICS_PORT": str(base + PROCESSES.index(name))}


@dataclass
class ServiceProcess:
    """One running service."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


def service_command(name: str) -> list[str]:
    """How a service runs: FastStream's own runner with the service's app factory (the API:
    uvicorn with its app factory, on API_HOST:API_PORT)."""
    if name == API:
        return [sys.executable, "-m", "services.api"]
    return [sys.executable, "-m", "faststream", "run", f"services.{name}.app:create_app",
            "--factory"]


def start_services(state_dir: Path, env: dict[str, str],
                   names: tuple[str, ...] = SERVICES) -> list[ServiceProcess]:
    """Start each service in its own process, logging to `<state_dir>/logs/<name>.log`."""
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started: list[ServiceProcess] = []
    for name in names:
        log_path = logs / f"{name}.log"
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                service_command(name),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env, **metrics_env(name, env)},
                start_new_session=True,  # Ctrl-C in a terminal goes to us; we stop them in order
            )
        started.append(ServiceProcess(name, process, log_path))
    return started


def stop_services(services: list[ServiceProcess], timeout_s: float = 20.0) -> None:
    """SIGTERM every service (graceful: in-flight messages finish), then SIGKILL stragglers."""
    for svc in services:
        if svc.process.poll() is None:
            svc.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for svc in services:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            svc.process.wait(remaining)
        except subprocess.TimeoutExpired:
            svc.process.kill()
            svc.process.wait()


def dead_services(services: list[ServiceProcess]) -> list[ServiceProcess]:
    """Services whose process has exited."""
    return [svc for svc in services if svc.process.poll() is not None]
