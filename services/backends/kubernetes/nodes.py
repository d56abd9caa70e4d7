"""Offline and online of a Kubernetes node: re-read, decide (protocol.py), patch.

Every patch is a JSON merge patch carrying the resourceVersion the decision was made on: if
someone changed the node meanwhile the API server answers 409 Conflict, and the node is read
and decided again, so a person's cordon made a moment ago is never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from services.backends.base import BackendError, NodeResult, Outcome
from services.backends.kubernetes.connection import as_json, call, merge_patch_node
from services.backends.kubernetes.protocol import Decision, NodeView

CONFLICT_TRIES = 5
Decide = Callable[[NodeView], Decision]


async def read_node(api: client.ApiClient, name: str) -> NodeView:
    try:
        node = await call(f"read node {name}", lambda: client.CoreV1Api(api).read_node(name))
    except ApiException as err:
        if err.status == 404:
            raise BackendError(f"node {name} does not exist") from err
        raise
    return NodeView.of(as_json(api, node))


async def apply(api: client.ApiClient, name: str, decide: Decide, *,
                dry_run: bool) -> NodeResult:
    """Reads the node, decides, and writes the decision's patch (dryRun=All when asked)."""
    for _ in range(CONFLICT_TRIES):
        decision = decide(await read_node(api, name))
        if decision.patch is None:
            return NodeResult(name, decision.outcome, decision.detail)
        patch = decision.patch
        try:
            await call(f"patch node {name}",
                       lambda p=patch: merge_patch_node(api, name, p, dry_run))  # type: ignore[misc]
        except ApiException as err:
            if err.status == 409:
                continue
            raise BackendError(f"patch node {name}: {err.status} {err.reason}") from err
        outcome = Outcome.DRY_RUN if dry_run else decision.outcome
        return NodeResult(name, outcome, decision.detail)
    raise BackendError(f"node {name} kept changing under {CONFLICT_TRIES} attempts to patch it")
