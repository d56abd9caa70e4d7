"""The checkpoint protocol before eviction, NoExecute from the template, and online after the
template's health check, end to end on the real API server (kwok nodes, the real scheduler,
controllers, PDBs and Eviction API), Kafka, Redis and every service as a process.

The workloads are played by the test: an asyncio task watches their pods, answers each
checkpoint request with the step it saved, and has the replacement say which step it resumed
from; a second workload does not speak the protocol. The templates are the built-in ones with
the offline step's taint `NoExecute`, the online step's `health_check`, and a short drain (so
a PodDisruptionBudget makes the drain step run twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import watch

from agent import fleet
from schemas.kubernetes import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_REQUEST_ANNOTATION,
    CHECKPOINT_TIMEOUT_ANNOTATION,
    RESUMED_FROM_ANNOTATION,
)
from services.backends.kubernetes.connection import KubeAccess
from tests.integration.harness import Record, edited_templates
from tests.integration.test_kubernetes_remediation import (
    LOAD_PCT,
    a_bad_node_and_two_good,
    claim_of,
    finished,
    kube_cluster,
    kube_env,
    our_taints,
    step_outputs,
    story,
    task_ended,
    task_events,
)
from tests.kube import KubeScope, settled

SAVED_STEP = 1200
# The drain's attempt is short, so a PDB that holds a pod fails it and the step runs again.
DRAIN_TIMEOUT_S = 12
HOLD_S = 2


def templates(directory: Path) -> Path:
    """The built-in templates, the offline step tainting NoExecute, the online step naming a
    health check, the drain step short."""
    drain = 'action: drain_node\n    args: {node_id: "{target}"}\n    timeout_s: 60'
    offline = 'action: offline_node\n    args: {node_id: "{target}"}'
    online = 'action: online_node\n    args: {node_id: "{target}"}'
    return edited_templates(
        directory, "offline.yaml", drain, drain.replace("60", str(DRAIN_TIMEOUT_S)),
        ("offline.yaml", offline, offline.replace('"}', '", effect: NoExecute}')),
        ("online.yaml", online, online.replace(
            '"}', f'", health_check: {{conditions_clear: true, hold_s: {HOLD_S}}}}}')))


@dataclass
class Workloads:
    """Watches the scope's pods in the API server's order. Pods of `speaks` answer each
    checkpoint request with SAVED_STEP, and their replacements say they resumed from it."""

    kube: KubeScope
    speaks: str
    """The app label of the workload that speaks the protocol."""
    originals: set[str] = field(default_factory=set)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    """(what, pod name, pod uid), in watch order: asked, acked, resumed, gone."""
    requests: list[str] = field(default_factory=list)
    """Every distinct checkpoint request seen on a pod."""

    def saw(self, what: str, pod: str, uid: str) -> bool:
        return (what, pod, uid) in self.log

    def index(self, what: str, pod: str, uid: str) -> int:
        return self.log.index((what, pod, uid))

    async def run(self) -> None:
        core = self.kube.core
        version = ""
        while True:  # the server ends a watch now and then: resume where it ended
            stream = watch.Watch()
            async with stream:
                async for event in stream.stream(core.list_namespaced_pod, self.kube.namespace,
                                                 resource_version=version,
                                                 timeout_seconds=120):
                    if event["type"] == "ERROR":  # e.g. 410 Gone: list again
                        version = ""
                        break
                    pod = event["raw_object"]
                    version = pod["metadata"].get("resourceVersion", version)
                    await self._on(event["type"], pod)

    async def _on(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        annotations: dict[str, str] = meta.get("annotations") or {}
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if not self.saw("gone", name, uid):
                self.log.append(("gone", name, uid))
            return
        request = annotations.get(CHECKPOINT_REQUEST_ANNOTATION)
        if request is not None and request not in self.requests:
            self.requests.append(request)
            self.log.append(("asked", name, uid))
        if (meta.get("labels") or {}).get("app") != self.speaks:
            return
        if request is not None and not self.saw("acked", name, uid):
            # The job saves its state (here: at once), then answers on its own pod.
            answer = {"request": json.loads(request)["id"], "step": SAVED_STEP,
                      "path": f"/ckpt/{name}/{SAVED_STEP}"}
            await self.kube.core.patch_namespaced_pod(name, self.kube.namespace, {
                "metadata": {"annotations": {CHECKPOINT_ANNOTATION: json.dumps(answer)}}})
            self.log.append(("acked", name, uid))
        if uid not in self.originals and not self.saw("resumed", name, uid):
            # A replacement: the job starts from the checkpoint and says which.
            await self.kube.core.patch_namespaced_pod(name, self.kube.namespace, {
                "metadata": {"annotations": {RESUMED_FROM_ANNOTATION: str(SAVED_STEP)}}})
            self.log.append(("resumed", name, uid))


@asynccontextmanager
async def playing(workloads: Workloads) -> AsyncIterator[Workloads]:
    workloads.originals = {p["metadata"]["uid"] for p in await workloads.kube.pods()}
    task = asyncio.create_task(workloads.run())
    try:
        yield workloads
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def a_speaking_and_a_silent_workload(kube: KubeScope) -> tuple[str, list[str]]:
    """Node `bad` running `ckpt-0` (opted in, held by a PDB that allows no disruption) and
    `plain-0` (does not speak the protocol), then two healthy nodes beside it."""
    bad = await kube.add_gpu_node("bad")
    await kube.add_gpu_statefulset("ckpt", 1, gpus=2,
                                   annotations={CHECKPOINT_TIMEOUT_ANNOTATION: "30"})
    await kube.add_gpu_statefulset("plain", 1, gpus=2)

    async def both() -> bool:
        return await kube.running_on(bad) == ["ckpt-0", "plain-0"]

    await settled(both, f"both pods Running on {bad}")
    await kube.add_pdb("ckpt", "ckpt", 1)
    return bad, [await kube.add_gpu_node("good-1"), await kube.add_gpu_node("good-2")]


def uid_of(pods: list[dict[str, Any]], name: str) -> str:
    return str(next(p["metadata"]["uid"] for p in pods if p["metadata"]["name"] == name))


async def test_a_drain_asks_the_workload_to_checkpoint_before_evicting_it_and_only_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_speaking_and_a_silent_workload(kube)
    pods = await kube.pods()
    ckpt, plain = uid_of(pods, "ckpt-0"), uid_of(pods, "plain-0")
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   TEMPLATER_TEMPLATE_DIR=str(templates(tmp_path / "templates")),
                   EXECUTOR_BACKOFF_BASE_S="3")
    async with (kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch_,
                playing(Workloads(kube, speaks="ckpt")) as workloads):
        fleet.inject_fault(tmp_path, bad, xid=[79])

        # The PDB holds ckpt-0 through the first attempt: the step fails and runs again.
        def attempt_failed(_: Record) -> bool:
            return any(e.step_state == "failed" for e in task_events(watch_, bad, "offline"))

        await watch_.wait_for(attempt_failed, 90, "the first drain attempt to fail")
        await kube.set_pdb_min_available("ckpt", 0)
        offline, plan = await task_ended(watch_, bad, "offline", "succeeded")

        # Asked once, acknowledged, then evicted; the re-run found its own request.
        assert len(workloads.requests) == 1, (workloads.requests, workloads.log)
        request = json.loads(workloads.requests[0])
        assert (request["task_id"], request["step"]) == (str(plan.task_id), "0:drain")
        assert request["id"] == f"{plan.task_id}/0:drain"
        assert workloads.index("asked", "ckpt-0", ckpt) < workloads.index(
            "acked", "ckpt-0", ckpt) < workloads.index("gone", "ckpt-0", ckpt), workloads.log
        # The workload that does not speak the protocol was not asked, and went all the same.
        assert not workloads.saw("asked", "plain-0", plain), workloads.log
        assert workloads.saw("gone", "plain-0", plain), workloads.log

        drains = [e for e in offline if e.step_index == 0 and e.step_state == "failed"]
        assert drains, story(offline)
        drained = step_outputs(offline, "drain_node")
        assert drained["checkpoints_acked"] == 1, drained
        assert drained["checkpoints_timed_out"] == 0, drained
        assert drained["checkpoints"] == (
            f"{kube.namespace}/ckpt-0@{SAVED_STEP}>resumed@{SAVED_STEP}"), drained
        assert await kube.running_on(bad) == []
        placed = [*await kube.running_on(good[0]), *await kube.running_on(good[1])]
        assert sorted(placed) == ["ckpt-0", "plain-0"]


async def problem_free(kube: KubeScope, node: str, kind: str) -> bool:
    conditions = (await kube.node(node))["status"].get("conditions") or ()
    return any(c["type"] == kind and c["status"] == "False" for c in conditions)


async def test_no_execute_from_the_template_and_online_only_once_the_node_is_healthy(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
    kube: KubeScope, kube_api: KubeAccess,
) -> None:
    bad, good = await a_bad_node_and_two_good(kube, min_available=0)
    # The agents here do not count GPUProblem as fault data (with it, the analyzer would not
    # even ask for the online task while it is True): the health check alone must hold the
    # node back, as it does for any problem condition the agents are not told about.
    env = kube_env(kafka_bootstrap, redis_url, namespace, tmp_path, str(kube_api.kubeconfig),
                   TEMPLATER_TEMPLATE_DIR=str(templates(tmp_path / "templates")),
                   AGENT_NODE_FAULT_CONDITIONS="KernelDeadlock")
    async with kube_cluster(env, tmp_path, kube_api, [bad, *good]) as watch_:
        fleet.inject_fault(tmp_path, bad, xid=[79])
        offline, plan = await task_ended(watch_, bad, "offline", "succeeded")
        node = await kube.node(bad)
        assert [t["effect"] for t in our_taints(node)] == ["NoExecute"]
        claim = json.loads(str(claim_of(node)))
        assert (claim["effect"], claim["task_id"]) == ("NoExecute", str(plan.task_id))
        assert step_outputs(offline, "offline_node")["outcome"] == "applied"

        # A node-problem detector still reports the GPU bad when the agent's fault clears.
        await kube.set_condition(bad, "GPUProblem", "True", reason="TestGPUProblem")
        fleet.clear_faults(tmp_path, bad)
        fleet.inject_fault(tmp_path, bad, load_pct=LOAD_PCT)

        def online_started(_: Record) -> bool:
            return any(e.step_state == "started" for e in task_events(watch_, bad, "online"))

        await watch_.wait_for(online_started, 90, "the online step to start")
        # The step waits: the node stays cordoned and tainted while the condition is True.
        for _ in range(3):
            await asyncio.sleep(1.0)
            node = await kube.node(bad)
            assert node["spec"].get("unschedulable") is True
            assert our_taints(node) != []
        await watch_.catch_up()
        assert not finished(watch_, bad, "online"), story(task_events(watch_, bad, "online"))

        await kube.set_condition(bad, "GPUProblem", "False", reason="TestGPUProblem")
        await claimed_gone(kube, bad)
        online, _ = await task_ended(watch_, bad, "online", "succeeded")
        outputs = step_outputs(online, "online_node")
        assert (outputs["outcome"], outputs["health"]) == ("applied", "clear"), outputs
        assert float(str(outputs["health_waited_s"])) > 0, outputs
        node = await kube.node(bad)
        assert not node["spec"].get("unschedulable")
        assert our_taints(node) == []
        assert claim_of(node) is None
        assert await problem_free(kube, bad, "GPUProblem")


async def claimed_gone(kube: KubeScope, node: str) -> None:
    async def gone() -> bool:
        return claim_of(await kube.node(node)) is None

    await settled(gone, f"{node} given back by the online step", timeout_s=90.0)
