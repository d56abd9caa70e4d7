"""An informer-like cache of a cluster's nodes and pods: one list, then a watch from the list's
resourceVersion, kept current by the API server's events instead of polling.

A watch that ends (the server's timeout) resumes from the last resourceVersion it saw; one the
server answers 410 Gone (that version is compacted away) lists again. Waiters (`wait_for`) are
woken on every change, so a drain sees a replacement pod the moment its event arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from services.backends.base import Inventory
from services.backends.kubernetes.connection import call
from services.backends.kubernetes.gpus import build_inventory

log = logging.getLogger("clusterwarden.backends.kubernetes.cache")
T = TypeVar("T")
# The server ends each watch after this long; the watch resumes from its resourceVersion.
WATCH_TIMEOUT_S = 240
RELIST_PAUSE_S = 1.0

Objects = dict[str, dict[str, Any]]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ClusterCache:
    def __init__(self, api: client.ApiClient, *, watch_timeout_s: int = WATCH_TIMEOUT_S) -> None:
        self._api = api
        self._watch_timeout_s = watch_timeout_s
        self._core = client.CoreV1Api(api)
        self.nodes: Objects = {}
        self.pods: Objects = {}
        self._by_controller: dict[str | None, Objects] = {}
        self._owner_of: dict[str, tuple[str | None]] = {}
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self.lists = 0
        """How many full lists were made (one per kind at start, then only after a 410)."""
        self.watches = 0
        """How many watches were opened (a new one each time the server ends one)."""

    async def start(self) -> None:
        """Lists nodes and pods (the cache is complete when this returns), then watches."""
        node_rv = await self._list("nodes", self.nodes)
        pod_rv = await self._list("pods", self.pods)
        self._tasks = [asyncio.create_task(self._watch("nodes", self.nodes, node_rv)),
                       asyncio.create_task(self._watch("pods", self.pods, pod_rv))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _lister(self, kind: str) -> Any:
        return (self._core.list_node if kind == "nodes"
                else self._core.list_pod_for_all_namespaces)

    async def _list(self, kind: str, store: Objects) -> str:
        answer = await call(f"list {kind}", lambda: self._raw_list(kind))
        items = {_key(o): o for o in answer.get("items") or ()}
        async with self._changed:
            store.clear()
            store.update(items)
            if store is self.pods:
                self._by_controller.clear()
                self._owner_of.clear()
                for obj in items.values():
                    self._index(obj, deleted=False)
            self._changed.notify_all()
        self.lists += 1
        return str((answer.get("metadata") or {}).get("resourceVersion", ""))

    async def _raw_list(self, kind: str) -> dict[str, Any]:
        """The list as the API server's JSON, as the watch's raw objects are: the client's
        models are skipped, which at a thousand nodes and their pods cost seconds of CPU
        (built, then serialised back) on the first step of a fault burst."""
        response = await self._lister(kind)(_preload_content=False)
        try:
            body = await response.read()
            if not 200 <= response.status <= 299:
                err = ApiException(status=response.status, reason=response.reason)
                err.body = body.decode("utf-8", errors="replace")
                raise err
            answer: dict[str, Any] = json.loads(body)
            return answer
        finally:
            response.release()

    async def _watch(self, kind: str, store: Objects, rv: str) -> None:
        while True:
            try:
                rv = await self._follow(kind, store, rv)
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status != 410:
                    log.warning("watch of %s failed (%s); listing again", kind, err.status)
                rv = await self._relist(kind, store)
            except Exception as err:
                log.warning("watch of %s broke (%s); listing again", kind, err)
                rv = await self._relist(kind, store)

    async def _relist(self, kind: str, store: Objects) -> str:
        while True:
            try:
                return await self._list(kind, store)
            except Exception as err:
                log.warning("list of %s failed (%s); trying again", kind, err)
                await asyncio.sleep(RELIST_PAUSE_S)

    async def _follow(self, kind: str, store: Objects, rv: str) -> str:
        """Applies one watch's events; answers the resourceVersion to resume from."""
        # The raw JSON, as the list's: the client's models per event would cost the CPU a
        # drain's waiters need (a thousand kwok nodes send status updates all the time).
        stream = watch.Watch(return_type="object")
        self.watches += 1
        async with stream:
            async for event in stream.stream(self._lister(kind), resource_version=rv,
                                             timeout_seconds=self._watch_timeout_s,
                                             allow_watch_bookmarks=True):
                obj = event["raw_object"]
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if event["type"] == "BOOKMARK":
                    continue
                async with self._changed:
                    if event["type"] == "DELETED":
                        store.pop(_key(obj), None)
                    else:
                        store[_key(obj)] = obj
                    if store is self.pods:
                        self._index(obj, deleted=event["type"] == "DELETED")
                    self._changed.notify_all()
        return rv

    def _index(self, pod: dict[str, Any], *, deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        owner = next((o.get("uid") for o in meta.get("ownerReferences") or ()
                      if o.get("controller")), None)
        key = _key(pod)
        before = self._owner_of.pop(key, None)
        if before is not None:
            self._by_controller.get(before[0], {}).pop(key, None)
        if not deleted:
            self._by_controller.setdefault(owner, {})[key] = pod
            self._owner_of[key] = (owner,)

    def pods_of(self, controller_uid: str | None) -> list[dict[str, Any]]:
        """The pods one controller owns (None: those without one), from an index kept with
        the cache: a drain waiting for replacements looks at these on every change, not at
        every pod of the cluster."""
        return list(self._by_controller.get(controller_uid, {}).values())

    def inventory(self) -> Inventory:
        return build_inventory(self.nodes.values(), self.pods.values())

    async def wait_for(self, found: Callable[[], T | None], timeout_s: float) -> T | None:
        """The first non-None answer of `found` (read after each change), or None at the
        deadline. An answer already there is taken even when no time is left (a retry whose
        deadline passed still sees what the watch already showed)."""
        if (ready := found()) is not None:
            return ready

        async def until() -> T:
            async with self._changed:
                while (value := found()) is None:
                    await self._changed.wait()
                return value
        try:
            return await asyncio.wait_for(until(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            return None
