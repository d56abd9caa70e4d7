"""Every panel of every dashboard (deploy/grafana/dashboards) shows data: a real Prometheus,
started by deploy/local/prometheus.sh and scraping every second, scrapes the real services and
agents (as processes, each with its metrics port) while a node's fault takes it offline and
ML tasks are routed; then each panel's query, asked of Prometheus's HTTP API, must parse and
return at least one series.

A query that names a metric no process exports returns nothing, and the panel would show
"No data" to its first reader; a label the metric does not carry is grouped by in vain, and
its legend would read blank: each series must carry every label its legend names.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import MlTaskOutcome, MlTaskSubmitted, now_utc
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.store.db import migrate
from tests.chaos.harness import CLUSTER, NODES, TARGET, all_up
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    ApiSite,
    Record,
    is_success_of,
    name,
    producer,
    services,
    stack_env,
    tap,
    until,
)
from tests.integration.test_routing import ready_arms
from tests.ports import free_port
from warden import launcher

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local" / "prometheus.sh"
DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
STACK = ("collector", "analyzer", "templater", "scheduler", "executor", "store", "router",
         "api")
MODEL = "digits-logreg@1"
ML_TASKS = 6
VIEWER_TOKEN = "dashboards-viewer-token-0123456789"
# Grafana fills these in itself; for the test's few minutes of data, windows that cover it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "10m", "$__interval": "1s"}
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def panels_of(panels: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows too."""
    for panel in panels:
        yield panel
        yield from panels_of(panel.get("panels", []))


@dataclass(frozen=True)
class PanelQuery:
    where: str
    expr: str
    legend: str

    @property
    def legend_labels(self) -> set[str]:
        return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", self.legend))


def dashboard_queries() -> list[PanelQuery]:
    """Every query of every panel of every dashboard."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in panels_of(dashboard["panels"]):
            for target in panel.get("targets", []):
                found.append(PanelQuery(f"{path.name}: {panel['title']} [{target['refId']}]",
                                        target["expr"], target.get("legendFormat", "")))
    return found


def as_prometheus_query(expr: str) -> str:
    """A panel's expression as Prometheus takes it: Grafana's own variables as the test's
    windows, the dashboard's variables (cluster, pool: used in =~ matchers) as "all"."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return VARIABLE.sub(".*", expr)


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports on the loopback."""
    for _ in range(50):
        first = free_port()
        if first + count > 65_535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {count} consecutive free ports")


@contextmanager
def prometheus(folder: Path, targets: Sequence[tuple[str, str]]) -> Iterator[str]:
    """The project's Prometheus (built by the script if it is not cached yet), scraping
    `targets` ((job, host:port)) every second, in a folder of its own; its base URL."""
    env = {**os.environ, "PROMETHEUS_DIR": str(folder), "PROMETHEUS_PORT": str(free_port()),
           "PROMETHEUS_SCRAPE_INTERVAL": "1s",
           "PROMETHEUS_TARGETS": " ".join(f"{job}={where}" for job, where in targets)}
    started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True,
                             check=False)
    if started.returncode != 0:
        pytest.fail(f"{SCRIPT} start failed:\n{started.stdout}\n{started.stderr}",
                    pytrace=False)
    try:
        yield f"http://127.0.0.1:{env['PROMETHEUS_PORT']}"
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, check=False)


async def query(client: httpx.AsyncClient, base: str, expr: str) -> list[dict[str, Any]]:
    """The series of an instant query; fails the test if Prometheus cannot parse it."""
    response = await client.get(f"{base}/api/v1/query", params={"query": expr})
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body.get('error', body)}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def unfit_queries(client: httpx.AsyncClient, base: str,
                        queries: Sequence[PanelQuery]) -> list[str]:
    """The queries that return no series, or a series without a label their legend names."""
    unfit = []
    for panel in queries:
        series = await query(client, base, as_prometheus_query(panel.expr))
        missing = {label for s in series for label in panel.legend_labels - s["metric"].keys()}
        if not series or missing:
            why = f"no label {sorted(missing)}" if series else "no series"
            unfit.append(f"{panel.where} ({why}): {panel.expr}")
    return unfit


async def submit_ml_tasks(bootstrap: str, namespace: str, count: int) -> None:
    """`count` digit classifications (an all-zero image will do: any answer is a success)."""
    async with producer(bootstrap) as prod:
        for _ in range(count):
            task_id, now = uuid4(), now_utc()
            event = MlTaskSubmitted(
                event_id=uuid4(), source="itest", occurred_at=now, cluster_id=CLUSTER,
                subject=str(task_id), task_id=task_id, task_type="digits", input=[0.0] * 64,
                deadline=now + timedelta(seconds=30), submitted_by="itest")
            await prod.send_and_wait(name(Topic.ML_TASKS_SUBMITTED, namespace),
                                     event.model_dump_json().encode(),
                                     key=str(task_id).encode())


def answered(record: Record) -> bool:
    if not record.topic.endswith(Topic.ML_TASKS_OUTCOMES.value):
        return False
    outcome = MlTaskOutcome.model_validate_json(record.value)
    return outcome.outcome == "succeeded" and outcome.node_id is not None


@pytest.mark.timeout(900)  # the waits' own deadlines, not this, are what should fail
async def test_every_dashboard_panel_returns_data(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20, f"{len(queries)} queries in {DASHBOARDS}: dashboards missing?"
    base_port = free_ports(len(launcher.PROCESSES))
    agent_ports = {node: free_port() for node in NODES}
    site = ApiSite.at(tmp_path)
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
                    AGENT_JOBS="", AGENT_PEER_PROBES="0", ANALYZER_ENABLED_NEEDS='["offline"]',
                    COLLECTOR_PROBE_PERIOD_S="3600", WARDEN_OUTBOX_GRACE_S="2",
                    WARDEN_METRICS_BASE_PORT=str(base_port),
                    WARDEN_METRICS_SAMPLE_PERIOD_S="1", **SMALL_POOL_SAFETY,
                    **site.env(f"{VIEWER_TOKEN}:vic:viewer"))
    targets = [(svc, f"127.0.0.1:{launcher.metrics_env(svc, env)['WARDEN_METRICS_PORT']}")
               for svc in STACK]
    targets += [("agent", f"127.0.0.1:{port}") for port in agent_ports.values()]
    # Migrated once here: the store and the API would otherwise both create the schema of the
    # same new file at the same moment.
    await migrate(site.database_url)
    with prometheus(tmp_path / "prometheus", targets) as prom:
        await run_and_check(prom, env, site, targets, agent_ports, queries, namespace,
                            kafka_bootstrap, redis_url, tmp_path)


async def run_and_check(prom: str, env: dict[str, str], site: ApiSite,
                        targets: Sequence[tuple[str, str]], agent_ports: dict[str, int],
                        queries: Sequence[PanelQuery], namespace: str,
                        kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    """The stack, its agents and the flows; then every panel's query against `prom`."""
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis, keys = connect_redis(redis_url), Keys(namespace)
    async with (services(env, tmp_path, STACK),
                tap(kafka_bootstrap, name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.ML_TASKS_OUTCOMES, namespace)) as watch,
                httpx.AsyncClient(timeout=10.0) as client):
        await register(redis_url, namespace, CLUSTER, NODES)
        for node in NODES:
            fleet.start_agent(node, gpus=1, cluster_id=CLUSTER, namespace=namespace,
                              state_dir=tmp_path, trusted_keys=trusted, interval_s=1.0,
                              env=env | {"WARDEN_METRICS_PORT": str(agent_ports[node])},
                              jobs="", models=MODEL)
        try:
            await all_up(watch)
            # ML routing: once the router's registry has the model ready on a node.
            await until(lambda: ready_arms(redis, keys), 120, "a model reported ready")
            await submit_ml_tasks(kafka_bootstrap, namespace, ML_TASKS)
            await watch.wait_for(answered, 120, "an ML task answered by a node")
            # The fault -> offline flow, to its end.
            fleet.inject_fault(tmp_path, TARGET, xid=[79])
            await watch.wait_for(is_success_of(watch, TARGET), 180,
                                 f"the offline task of {TARGET} to succeed")
            # A call of the API, for its request metrics.
            tasks = await client.get(f"{site.base}/api/tasks",
                                     headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
            assert tasks.status_code == 200, tasks.text

            async def all_scraped() -> bool:
                up = await query(client, prom, "up == 1")
                return len(up) == len(targets)
            await until(all_scraped, 60, "every service and agent scraped")

            missing: list[str] = []

            async def every_panel_has_data() -> bool:
                missing[:] = await unfit_queries(client, prom, queries)
                return not missing
            started = time.monotonic()
            await until(every_panel_has_data, 120,
                        lambda: "every panel query returning labelled series; not:\n  "
                                + "\n  ".join(missing))
            print(f"{len(queries)} panel queries return data "
                  f"({time.monotonic() - started:.1f} s after the flow)")
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
