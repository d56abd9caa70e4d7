"""A node's jobs on Kubernetes: the GPU pods bound to it, read from the API server.

On a Kubernetes node ClusterWarden runs no jobs of its own: the cluster's workloads are the
jobs. The agent lists the pods bound to its node (`spec.nodeName=<node>`) and then watches
them from the list's resourceVersion, as informers do; each pod asking for `nvidia.com/gpu` is
reported as one job (`pod_jobs`, pure). The agent never starts, stops or moves such a pod:
ClusterWarden moves pods through the cluster's Kubernetes backend (evictions), so the agent
answers job actions `not_supported`.

GPU indices: the API says how many GPUs a pod holds, not which. Where the kubelet's
pod-resources socket is mounted (the DaemonSet, AGENT_POD_RESOURCES_SOCKET), the agent asks the
kubelet which GPUs each pod holds (agent/jobs/pod_resources.py) and maps their UUIDs to its
NVML indices; each job says so (`gpu_mapping: pod_resources`). Without the socket (kwok nodes
in the tests, an agent outside the node) each pod is given the next free indices in name
order, so the report's per-GPU view adds up, and each job says `gpu_mapping: in_name_order`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from agent.faults import FaultPlan
from agent.jobs.kube_node import ConditionRule, condition_faults
from agent.jobs.pod_resources import PodResourcesClient, pod_gpu_indices
from agent.jobs.runner import JobState
from schemas.events.v1 import Fault, JobInfo, NodeMode
from schemas.kube_gpus import pod_gpus
from schemas.kubernetes import OFFLINE_ANNOTATION

log = logging.getLogger("clusterwarden.agent.kube")

# A watch the server ends is resumed at once; one that fails waits this long first.
RETRY_S = 1.0
# The kubelet's List has no watch: it is asked again this often.
POD_RESOURCES_EVERY_S = 2.0
WATCH_TIMEOUT_S = 60
_STATES: dict[str, JobState] = {"Pending": "starting", "Running": "running", "Succeeded": "stopped",
           "Failed": "failed"}


def job_id_of(pod: Mapping[str, Any]) -> str:
    """A pod as a job id: `<namespace>.<name>` (both DNS names, so a valid identifier)."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}.{meta.get('name', '')}"[:128]


def pod_jobs(pods: Iterable[Mapping[str, Any]], gpus: int,
             held: Mapping[str, Sequence[int]] | None = None) -> list[JobInfo]:
    """The node's GPU pods as the report's jobs, in name order. `held`: the GPU indices each
    pod holds as the kubelet says (by job id; a pod it does not list holds none yet), or
    None without the kubelet: then each pod gets the next free indices."""
    jobs: list[JobInfo] = []
    next_gpu = 0
    for pod in sorted((p for p in pods if pod_gpus(p) > 0), key=job_id_of):
        phase = (pod.get("status") or {}).get("phase", "Pending")
        state: JobState = _STATES.get(phase, "starting")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            state = "stopped"  # evicted: going away
        job_id = job_id_of(pod)
        if held is not None:
            indices = [i for i in held.get(job_id, ()) if i < min(gpus, 64)]
        else:
            count = pod_gpus(pod)
            indices = [i for i in range(next_gpu, next_gpu + count) if i < min(gpus, 64)]
            next_gpu += count
        jobs.append(JobInfo(job_id=job_id, kind="training", state=state, gpu_indices=indices,
                            gpu_mapping="in_name_order" if held is None else "pod_resources"))
    return jobs


def node_mode(node: Mapping[str, Any] | None, journaled: NodeMode) -> NodeMode:
    """The node's mode as its Node says: offline while it carries ClusterWarden's claim (the
    Kubernetes backend cordoned it; no command reaches the agent), else the journal's. A
    node someone else cordoned is not ClusterWarden's to call offline."""
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return "offline" if OFFLINE_ANNOTATION in annotations else journaled


class KubePods:
    """The job source of an agent on a Kubernetes node: its GPU pods, kept by list + watch."""

    def __init__(self, node_id: str, gpus: int, kubeconfig: str | None,
                 conditions: ConditionRule | None = None, *,
                 pod_resources: PodResourcesClient | None = None,
                 gpu_uuids: Sequence[str] = ()) -> None:
        self.node_id = node_id
        self.gpus = gpus
        self.kubeconfig = kubeconfig
        self.conditions = conditions or ConditionRule()
        self.pods: dict[str, dict[str, Any]] = {}
        self.node: dict[str, Any] | None = None
        self.pod_resources = pod_resources
        self.gpu_uuids = tuple(gpu_uuids)
        # The GPU indices each pod holds, as the kubelet last said; None: no kubelet answer
        # (no socket), the pods get indices in name order.
        self.held: dict[str, list[int]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Starts following the node's pods (called on the agent's event loop)."""
        if not self._tasks:
            self._loop = asyncio.get_running_loop()
            self._tasks = [self._loop.create_task(self._follow(kind), name=f"{kind}-{self.node_id}")
                           for kind in ("pods", "node")]
            self._tasks.append(self._loop.create_task(self._follow_kubelet(),
                                                      name=f"pod-resources-{self.node_id}"))

    def reconcile(self, mode: NodeMode, plan: FaultPlan) -> None:
        """Nothing to do: the pods follow the node's cordon and taints, not the agent."""

    def snapshot(self, now: datetime) -> list[JobInfo]:
        return pod_jobs(self.pods.values(), self.gpus, self.held)

    def mode(self, journaled: NodeMode) -> NodeMode:
        return node_mode(self.node, journaled)

    def node_faults(self, now: datetime) -> list[Fault]:
        """The Node's conditions that are fault data (not Ready, a problem detector's)."""
        return condition_faults(self.node, self.conditions, now)

    def close(self) -> None:
        # Called from a worker thread (the agent keeps blocking closes off its loop).
        if self._loop is not None and not self._loop.is_closed():
            for task in self._tasks:
                self._loop.call_soon_threadsafe(task.cancel)
        self._tasks = []

    async def _follow_kubelet(self) -> None:
        """Asks the kubelet which GPUs each pod holds, every POD_RESOURCES_EVERY_S. Without the
        socket the pods get indices in name order (said once in the log, and on every job)."""
        socket = self.pod_resources.socket if self.pod_resources else ""
        said: bool | None = None
        while True:
            source = self.pod_resources
            found = source is not None and source.available()
            if found != said:
                said = found
                if found:
                    log.info("GPUs of %s's pods: from the kubelet's pod-resources API at %s",
                             self.node_id, socket)
                else:
                    self.held = None
                    log.warning("GPUs of %s's pods: no pod-resources socket%s; each pod is "
                                "given the next free GPU indices in name order, not the GPUs "
                                "it holds", self.node_id, f" at {socket}" if socket else "")
            if found and source is not None:
                try:
                    self.held = pod_gpu_indices(await source.list_gpus(), self.gpu_uuids)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # the kubelet restarting: keep its last answer
                    log.warning("pod-resources List on %s failed: %s", socket, err)
            await asyncio.sleep(POD_RESOURCES_EVERY_S)

    async def _connect(self) -> client.ApiClient:
        configuration = client.Configuration()
        if self.kubeconfig:
            await config.load_kube_config(config_file=self.kubeconfig,
                                          client_configuration=configuration,
                                          persist_config=False)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        return client.ApiClient(configuration)

    async def _follow(self, kind: str) -> None:
        api = await self._connect()
        try:
            rv = ""
            while True:
                try:
                    rv = rv or await self._list(api, kind)
                    rv = await self._watch(api, kind, rv)
                except asyncio.CancelledError:
                    raise
                except ApiException as err:
                    if err.status == 410:
                        rv = ""  # too old: list again
                    log.warning("pods of %s: %s; again in %.0fs", self.node_id, err.reason,
                                RETRY_S)
                    await asyncio.sleep(RETRY_S)
                except Exception as err:  # the API server away: keep the last view, retry
                    log.warning("pods of %s: %s; again in %.0fs", self.node_id, err, RETRY_S)
                    rv = ""
                    await asyncio.sleep(RETRY_S)
        finally:
            with contextlib.suppress(Exception):
                await api.close()

    def _lister(self, api: client.ApiClient, kind: str) -> tuple[Any, str]:
        """The list call and field selector of the node's pods, or of the Node itself."""
        core = client.CoreV1Api(api)
        if kind == "pods":
            return core.list_pod_for_all_namespaces, f"spec.nodeName={self.node_id}"
        return core.list_node, f"metadata.name={self.node_id}"

    def _put(self, kind: str, data: dict[str, Any], deleted: bool = False) -> None:
        if kind == "node":
            self.node = None if deleted else data
        elif deleted:
            self.pods.pop(job_id_of(data), None)
        else:
            self.pods[job_id_of(data)] = data

    async def _list(self, api: client.ApiClient, kind: str) -> str:
        lister, selector = self._lister(api, kind)
        answer = await lister(field_selector=selector)
        if kind == "pods":
            self.pods = {}
        else:
            self.node = None
        for item in answer.items:
            self._put(kind, api.sanitize_for_serialization(item))
        return str(answer.metadata.resource_version)

    async def _watch(self, api: client.ApiClient, kind: str, rv: str) -> str:
        lister, selector = self._lister(api, kind)
        stream = watch.Watch().stream(lister, field_selector=selector, resource_version=rv,
                                      timeout_seconds=WATCH_TIMEOUT_S)
        async for event in stream:
            change, obj = event["type"], event["object"]
            if change == "ERROR":
                raise ApiException(status=int(getattr(obj, "code", 0) or 0) or 500,
                                   reason=str(getattr(obj, "message", obj)))
            data = api.sanitize_for_serialization(obj)
            rv = str((data.get("metadata") or {}).get("resourceVersion") or rv)
            self._put(kind, data, deleted=change == "DELETED")
        return rv
