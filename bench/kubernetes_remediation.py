"""Remediation of a Kubernetes cluster at scale: N kwok GPU nodes (default 1,000) running GPU
pods of StatefulSets and Deployments, 1 % of them hit by a fatal XID at once.

Everything is the real thing except the nodes' hardware: the real API server, scheduler,
controllers and Eviction API (deploy/local/kubernetes.sh; kwok plays the kubelets), the real
broker, Redis and the pipeline's services as processes (collector, analyzer, templater,
scheduler, executor), the cluster registered with the `kubernetes` backend and its eviction
budget. The nodes' agents are the fleet simulator (bench/fleet_sim.py): one process speaking
the agents' protocol for every node, enrolled as real agents are and answering the centre's
signed probes (a thousand agent processes would not fit a 2-core machine). A faulted node
reports its XID at once, as an agent does, and again in its next regular report (the offline
need wants two).

Measured per faulted node, from the moment of the fault (this machine's wall clock), on a
list + watch of the API server (bench-side, as informers do):

* fault -> node cordoned: the Node first seen unschedulable or with ClusterWarden's taint;
* fault -> every evicted pod's replacement Running elsewhere (the controller's new pod on
  another node, as the drain itself recognises it);
* evictions per second: the evicted pods seen deleted, over the span between the first and
  the last, against the cluster's budget (`warden cluster register --evictions-per-s`); and
  over the span from the last faulted node's cordon (every drain under way, the budget the
  only pace) to the last eviction;
* the scheduler's limits (offline budget, short-circuit, rate limit): what each held back,
  from the task events (created -> dispatched) and the scheduler's log.

Run: `python -m bench.kubernetes_remediation` (`--quick`: a small cluster CI can run; see
--help) with the servers up (`make up`, `source deploy/local/env.sh`); figures go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict
from uuid import uuid4

from aiokafka import AIOKafkaConsumer

from bench.common import Spread, exit_cleanly_on_sigterm, spread
from bench.fleet_sim import FleetSim
from bench.remediation import Events
from bench.trace_replay.stack import stack
from common.signing import verifier_from_files
from schemas.events.v1 import Fault
from schemas.kubernetes import TAINT_KEY
from schemas.topics import Topic, topic_name
from services.backends.kubernetes.cache import ClusterCache
from services.backends.kubernetes.connection import KubeAccess, connect
from services.backends.kubernetes.gpus import PodRef, find_replacement, live
from services.scheduler.safety import DEFAULT_BUDGET_FRACTION, DEFAULT_UNHEALTHY_FRACTION
from services.shared.registry import ClusterBackend, name_backend
from tests.kube import KubeScope

CLUSTER = "kbench"
SERVICES = ("collector", "analyzer", "templater", "scheduler", "executor")
# Jobs are left out: kwok's default stages complete a Job's pods at once, so none would run.
CONTROLLER_KINDS = ("statefulset", "deployment")
# Three controllers of each kind share the pods: each eviction's replacement comes from one.
CONTROLLERS = 6
SETUP_TIMEOUT_S = 900.0
RUN_TIMEOUT_S = 300.0
# The scheduler's log lines that say a limit held a task back (services/scheduler/handlers.py).
HELD_BY = {"rate limit": "held back by rate limit", "pool limits": "held back by pool"}


@dataclass(frozen=True)
class Shape:
    """The cluster, the fault burst, and the limits the run keeps on."""

    nodes: int = 1_000
    fault_pct: float = 1.0
    pods_per_node: int = 2
    gpus_per_pod: int = 2
    interval_s: float = 2.0
    evictions_per_s: float = 5.0
    eviction_burst: int = 1
    scheduler_rate_per_s: float = 5.0
    scheduler_burst: int = 5

    @property
    def faults(self) -> int:
        return max(1, round(self.nodes * self.fault_pct / 100))

    def settings(self) -> dict[str, str]:
        """The services' settings: only the fault need; the scheduler's limits as given (the
        offline budget and short-circuit at their defaults)."""
        # The centre's probes every 5 minutes, 30 s to answer: one simulator process cannot
        # verify and answer a thousand signed probes within the default 5 s on 2 shared
        # cores, and each late answer raises a false probe_failed offline need (a drain of a
        # healthy node, spending the eviction budget the burst is measured against).
        return {"ANALYZER_ENABLED_NEEDS": '["offline"]', "WARDEN_LOG_LEVEL": "INFO",
                "COLLECTOR_PROBE_PERIOD_S": "300", "COLLECTOR_PROBE_DEADLINE_S": "30",
                "SCHEDULER_RATE_PER_S": str(self.scheduler_rate_per_s),
                "SCHEDULER_RATE_BURST": str(self.scheduler_burst)}


QUICK = Shape(nodes=40, fault_pct=5.0)


@dataclass
class Victim:
    """A faulted node: its GPU pods at the fault, and when each thing was first seen."""

    node: str
    pods: list[PodRef]
    faulted_at: float = 0.0
    cordoned_at: float | None = None
    evicted_at: dict[str, float] = field(default_factory=dict)
    replaced_at: dict[str, float] = field(default_factory=dict)
    replaced_on: dict[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return self.cordoned_at is not None and len(self.replaced_at) == len(self.pods)


class Observer:
    """Reads the cache after each change and notes when each victim's node was cordoned and
    each pod evicted and replaced (`ClusterCache.wait_for` calls `check` on every event)."""

    def __init__(self, cache: ClusterCache, victims: list[Victim]) -> None:
        self.cache = cache
        self.victims = victims
        self.claimed: set[str] = {p.uid for v in victims for p in v.pods}

    def check(self) -> bool | None:
        now = time.time()
        for victim in self.victims:
            node = self.cache.nodes.get(f"/{victim.node}")
            if victim.cordoned_at is None and node is not None and cordoned(node):
                victim.cordoned_at = now
        if any(len(v.replaced_at) < len(v.pods) for v in self.victims):
            for victim in self.victims:
                self._follow(victim, now)
        return True if all(v.settled for v in self.victims) else None

    def _follow(self, victim: Victim, now: float) -> None:
        # The cache's own index of pods by controller, as the drain reads it: regrouping
        # every pod of the cluster on each of the thousand nodes' status events made this
        # watcher the heaviest process of the run.
        for pod in victim.pods:
            if pod.key in victim.replaced_at:
                continue
            if pod.key not in victim.evicted_at:
                current = self.cache.pods.get(pod.key)
                if current is not None and current["metadata"].get("uid") == pod.uid \
                        and live(current):
                    continue
                victim.evicted_at[pod.key] = now
            match = find_replacement(pod, self.cache.pods_of(pod.controller_uid), self.claimed)
            if match is not None:
                self.claimed.add(match["metadata"]["uid"])
                victim.replaced_at[pod.key] = now
                victim.replaced_on[pod.key] = match["spec"]["nodeName"]


def cordoned(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec") or {}
    return bool(spec.get("unschedulable")) or any(
        t.get("key") == TAINT_KEY for t in spec.get("taints") or ())


async def build_cluster(kube: KubeScope, shape: Shape) -> list[str]:
    """The kwok nodes (8 GPUs each), then the GPU controllers spread over them."""
    gate = asyncio.Semaphore(16)

    async def node(index: int) -> str:
        async with gate:
            return await kube.add_gpu_node(f"n{index:05d}")

    names = list(await asyncio.gather(*(node(i) for i in range(shape.nodes))))
    total = shape.nodes * shape.pods_per_node
    for index in range(CONTROLLERS):
        size = total // CONTROLLERS + (1 if index < total % CONTROLLERS else 0)
        kind = CONTROLLER_KINDS[index % len(CONTROLLER_KINDS)]
        name = f"{kind}-{index}"
        if kind == "statefulset":
            await kube.add_gpu_statefulset(name, size, gpus=shape.gpus_per_pod)
        else:
            await kube.add_gpu_deployment(name, size, gpus=shape.gpus_per_pod)
    return names


def running_pods(cache: ClusterCache, namespace: str) -> list[dict[str, Any]]:
    return [p for p in cache.pods.values() if p["metadata"].get("namespace") == namespace
            and p["spec"].get("nodeName") and live(p)
            and (p.get("status") or {}).get("phase") == "Running"]


def choose_victims(cache: ClusterCache, namespace: str, nodes: list[str],
                   count: int) -> list[Victim]:
    """`count` nodes that run GPU pods, the same ones for the same layout (seeded)."""
    by_node: dict[str, list[PodRef]] = {}
    for pod in running_pods(cache, namespace):
        by_node.setdefault(pod["spec"]["nodeName"], []).append(PodRef.of(pod))
    busy = sorted(n for n in nodes if by_node.get(n))
    chosen = random.Random(14).sample(busy, min(count, len(busy)))
    return [Victim(node=n, pods=sorted(by_node[n], key=lambda p: p.key)) for n in chosen]


class NodeFigures(TypedDict):
    """One faulted node: seconds from its fault, and where its pods went."""

    node: str
    cordoned_s: float | None
    replaced_s: float | None
    pods: int
    replaced_on: list[str]


def node_figures(victim: Victim) -> NodeFigures:
    done = victim.pods and len(victim.replaced_at) == len(victim.pods)
    return {"node": victim.node,
            "cordoned_s": None if victim.cordoned_at is None
            else round(victim.cordoned_at - victim.faulted_at, 2),
            "replaced_s": round(max(victim.replaced_at.values()) - victim.faulted_at, 2)
            if done else None,
            "pods": len(victim.pods), "replaced_on": sorted(set(victim.replaced_on.values()))}


class Figures(TypedDict):
    nodes: int
    faulted: int
    pods: int
    evicted: int
    cordoned: int
    replaced: int
    fault_to_cordoned_s: Spread
    fault_to_replacements_running_s: Spread
    fault_to_task_created_s: Spread
    task_created_to_dispatched_s: Spread
    fault_to_task_succeeded_s: Spread
    other_offline_tasks: int
    """Offline tasks of nodes not faulted (false alarms: they would share the budgets)."""
    evictions_per_s: float | None
    evictions_per_s_all_drains_under_way: float | None
    eviction_budget_per_s: float
    eviction_burst: int
    limits: dict[str, str]
    per_node: list[NodeFigures]


def eviction_rate(victims: list[Victim]) -> float | None:
    """Evictions a second between the first and the last seen (None: fewer than two)."""
    times = sorted(t for v in victims for t in v.evicted_at.values())
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return round((len(times) - 1) / (times[-1] - times[0]), 2)


def saturated_eviction_rate(victims: list[Victim]) -> float | None:
    """Evictions a second once every faulted node was cordoned, up to the last eviction.

    From then on every drain is under way and its pods wait for the budget's tokens, so the
    budget is the only pace; before it, the drains begin one by one as their tasks arrive and
    the bucket (which saves no more than its burst) idles between them for want of pods, which
    is the arrival of the work, not a limit (None: under two evictions in the span)."""
    cordons = [v.cordoned_at for v in victims]
    if not cordons or any(c is None for c in cordons):
        return None
    start = max(c for c in cordons if c is not None)
    times = sorted(t for v in victims for t in v.evicted_at.values() if t > start)
    if len(times) < 2 or times[-1] <= start:
        return None
    return round(len(times) / (times[-1] - start), 2)


def task_phases(events: Events, victim: Victim) -> tuple[float | None, float | None,
                                                          float | None]:
    """Seconds from the fault to the offline task's creation, from creation to its dispatch,
    and from the fault to its success (broker times)."""
    parent, _ = events.for_target(victim.node)
    created = next((t for t, e in parent if e.state == "created"), None)
    dispatched = next((t for t, e in parent if e.state == "dispatched"), None)
    done = next((t for t, e in parent if e.state == "succeeded" and e.step_state is None),
                None)
    return (None if created is None else created - victim.faulted_at,
            None if created is None or dispatched is None else dispatched - created,
            None if done is None else done - victim.faulted_at)


def held_lines(log_path: Path) -> dict[str, int]:
    """How many times the scheduler logged each limit holding a task back."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return {limit: text.count(marker) for limit, marker in HELD_BY.items()}


def figures(shape: Shape, victims: list[Victim], events: Events,
            held: dict[str, int]) -> Figures:
    phases = [task_phases(events, v) for v in victims]
    waits = [p[1] for p in phases if p[1] is not None]
    budget_nodes = math.ceil(shape.nodes * DEFAULT_BUDGET_FRACTION)
    return {
        "nodes": shape.nodes, "faulted": len(victims),
        "pods": sum(len(v.pods) for v in victims),
        "evicted": sum(len(v.evicted_at) for v in victims),
        "cordoned": sum(v.cordoned_at is not None for v in victims),
        "replaced": sum(len(v.replaced_at) for v in victims),
        "fault_to_cordoned_s": spread(v.cordoned_at - v.faulted_at for v in victims
                                      if v.cordoned_at is not None),
        "fault_to_replacements_running_s": spread(
            max(v.replaced_at.values()) - v.faulted_at for v in victims
            if v.pods and len(v.replaced_at) == len(v.pods)),
        "fault_to_task_created_s": spread(p[0] for p in phases if p[0] is not None),
        "task_created_to_dispatched_s": spread(waits),
        "fault_to_task_succeeded_s": spread(p[2] for p in phases if p[2] is not None),
        "other_offline_tasks": len({e.task_id for _, e in events.events if e.task is not None
                                    and e.task.need_kind == "offline"
                                    and e.task.target not in {v.node for v in victims}}),
        "evictions_per_s": eviction_rate(victims),
        "evictions_per_s_all_drains_under_way": saturated_eviction_rate(victims),
        "eviction_budget_per_s": shape.evictions_per_s, "eviction_burst": shape.eviction_burst,
        "limits": {
            "eviction budget": f"{shape.evictions_per_s}/s, burst {shape.eviction_burst}: "
                               "paced every eviction",
            "scheduler rate limit": f"{shape.scheduler_rate_per_s}/s, burst "
                                    f"{shape.scheduler_burst} offline tasks: held "
                                    f"{held['rate limit']} dispatch attempt(s), longest wait "
                                    f"{max(waits, default=0.0):.2f} s",
            "offline budget": f"{DEFAULT_BUDGET_FRACTION:.0%} of the pool = {budget_nodes} "
                              f"nodes; short-circuit above {DEFAULT_UNHEALTHY_FRACTION:.0%} "
                              f"unhealthy: held {held['pool limits']} attempt(s)",
        },
        "per_node": [node_figures(v) for v in victims],
    }


async def inject(sim: FleetSim, victims: list[Victim]) -> None:
    """XID 79 on GPU 0 of every victim at once, each reported at once as an agent does."""
    now = time.time()
    for victim in victims:
        victim.faulted_at = now
        sim.add_fault(victim.node, Fault(kind="xid", code=79, gpu_index=0,
                                         detail="GPU has fallen off the bus"))
    await asyncio.gather(*(sim.report_now(v.node) for v in victims))


async def run(shape: Shape, bootstrap: str, redis_url: str, kubeconfig: str) -> Figures:
    api = await connect(KubeAccess(kubeconfig=kubeconfig))
    kube = KubeScope(api=api, prefix=f"kb{uuid4().hex[:8]}")
    cache = ClusterCache(api)
    try:
        await kube.open()
        nodes = await build_cluster(kube, shape)
        await cache.start()
        total = shape.nodes * shape.pods_per_node
        placed = await cache.wait_for(
            lambda: True if len(running_pods(cache, kube.namespace)) >= total else None,
            SETUP_TIMEOUT_S)
        if placed is None:
            raise TimeoutError(f"{total} GPU pods not all Running in {SETUP_TIMEOUT_S} s")
        victims = choose_victims(cache, kube.namespace, nodes, shape.faults)
        return await _remediate(shape, bootstrap, redis_url, kubeconfig, nodes, victims,
                                Observer(cache, victims))
    finally:
        await cache.close()
        try:
            await kube.close()
        finally:
            await api.close()


async def _remediate(shape: Shape, bootstrap: str, redis_url: str, kubeconfig: str,
                     nodes: list[str], victims: list[Victim], observer: Observer) -> Figures:
    """The pipeline and the simulated fleet up, the burst injected, its end awaited."""
    async with stack(bootstrap, redis_url, "kube", nodes, shape.settings(), False,
                     services_run=SERVICES, cluster=CLUSTER) as running:
        await name_backend(redis_url, running.namespace, CLUSTER, ClusterBackend(
            kind="kubernetes", kubeconfig=kubeconfig, evictions_per_s=shape.evictions_per_s,
            eviction_burst=shape.eviction_burst))
        sim = FleetSim(bootstrap, running.namespace, CLUSTER, nodes,
                       interval_s=shape.interval_s, load_pct=50.0,
                       verifier=verifier_from_files(running.trusted_keys),
                       report_master=running.report_master)
        consumer = AIOKafkaConsumer(topic_name(Topic.OPS_TASK_EVENTS, running.namespace),
                                    bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await sim.start()
        await consumer.start()
        events = Events(consumer)
        pump = asyncio.create_task(events.pump())
        try:
            await running.wait_ready(shape.nodes, 120.0)
            await inject(sim, victims)
            await observer.cache.wait_for(observer.check, RUN_TIMEOUT_S)
            await asyncio.sleep(2.0)  # the tasks' last events
            sim.check()
            running.check()
        finally:
            pump.cancel()
            await consumer.stop()
            await sim.stop()
        return figures(shape, victims, events,
                       held_lines(running.state / "logs" / "scheduler.log"))


def table(result: Figures) -> str:
    """The figures as the human table docs/benchmarks.md shows."""
    rows = [("fault -> node cordoned", result["fault_to_cordoned_s"]),
            ("fault -> replacements Running elsewhere",
             result["fault_to_replacements_running_s"]),
            ("fault -> offline task created", result["fault_to_task_created_s"]),
            ("task created -> dispatched (scheduler)", result["task_created_to_dispatched_s"]),
            ("fault -> task succeeded", result["fault_to_task_succeeded_s"])]
    lines = ["| measure | p50 (s) | p99 (s) | max (s) |", "|---|---|---|---|"]
    lines += [f"| {label} | {s['p50']} | {s['p99']} | {s['max']} |" for label, s in rows]
    lines.append(f"\nevictions: {result['evicted']} of {result['pods']} pods, "
                 f"{result['evictions_per_s']}/s against a budget of "
                 f"{result['eviction_budget_per_s']}/s (burst {result['eviction_burst']}); "
                 f"{result['evictions_per_s_all_drains_under_way']}/s once every faulted "
                 "node's drain was under way")
    lines += [f"{limit}: {what}" for limit, what in result["limits"].items()]
    lines.append(f"offline tasks of nodes not faulted: {result['other_offline_tasks']}")
    return "\n".join(lines)


def shape_of(args: argparse.Namespace) -> Shape:
    base = QUICK if args.quick else Shape()
    return Shape(nodes=args.nodes or base.nodes, fault_pct=args.fault_pct or base.fault_pct,
                 pods_per_node=base.pods_per_node, gpus_per_pod=base.gpus_per_pod,
                 interval_s=args.interval, evictions_per_s=args.evictions_per_s,
                 eviction_burst=args.eviction_burst, scheduler_rate_per_s=args.scheduler_rate,
                 scheduler_burst=args.scheduler_burst)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"A small cluster ({QUICK.nodes} nodes, {QUICK.fault_pct} %%).")
    parser.add_argument("--nodes", type=int, default=0, help="kwok GPU nodes (1,000).")
    parser.add_argument("--fault-pct", type=float, default=0.0, help="Nodes faulted, % (1).")
    parser.add_argument("--interval", type=float, default=2.0, help="Report interval, s.")
    parser.add_argument("--evictions-per-s", type=float, default=5.0)
    parser.add_argument("--eviction-burst", type=int, default=1)
    parser.add_argument("--scheduler-rate", type=float, default=5.0,
                        help="Offline tasks a second the scheduler starts (SCHEDULER_RATE_PER_S).")
    parser.add_argument("--scheduler-burst", type=int, default=5)
    args = parser.parse_args()
    # Retried requests (a new topic's leader not elected yet) are not news here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    shape = shape_of(args)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    kubeconfig = os.environ.get("KUBECONFIG_CLUSTERWARDEN", "")
    if not kubeconfig:
        raise SystemExit("KUBECONFIG_CLUSTERWARDEN is not set: `make up` and "
                         "`source deploy/local/env.sh` first")
    print(f"# kubernetes remediation, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()} ({os.cpu_count()} cores), {shape}", flush=True)
    result = await run(shape, bootstrap, redis_url, kubeconfig)
    print(json.dumps(result))
    print(table(result))


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
