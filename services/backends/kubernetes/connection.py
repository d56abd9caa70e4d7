"""Reaching a cluster's API server: credentials, and what its failures mean to a step.

Credentials come from a kubeconfig file or, inside the cluster, from the pod's service account.
`impersonate` makes every request as another user (the `Impersonate-User` header): the tests
run the backend as its least-privilege service account this way, from an admin's kubeconfig.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from services.backends.base import BackendError, BackendForbidden

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class KubeAccess:
    """How to reach one cluster's API server."""

    kubeconfig: str | None = None
    """A kubeconfig file; None: the in-cluster service account."""
    context: str | None = None
    impersonate: str | None = None
    """A user every request is made as, e.g. system:serviceaccount:NS:NAME."""


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


async def connect(access: KubeAccess) -> client.ApiClient:
    """An API client for the cluster (the caller closes it)."""
    configuration = client.Configuration()
    if access.kubeconfig is None:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=access.kubeconfig, context=access.context,
                                      client_configuration=configuration,
                                      persist_config=False)
    api = client.ApiClient(configuration)
    if access.impersonate:
        api.set_default_header("Impersonate-User", access.impersonate)
    return api


def status_message(err: ApiException) -> str:
    """The API server's own words for a refused request (its Status message)."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or err.reason or err.status)


async def call(what: str, request: Callable[[], Awaitable[T]]) -> T:
    """Runs one API request; a refusal of the credentials becomes `BackendForbidden`
    (permanent: retrying cannot help and nothing was changed), a transport failure a
    transient `BackendError`. Other API answers are the caller's to read."""
    try:
        return await request()
    except ApiException as err:
        if err.status in (401, 403):
            raise BackendForbidden(f"{what}: the API server refused ClusterWarden's "
                                   f"credentials ({err.status}): {status_message(err)}") from err
        raise
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise BackendError(f"{what}: the API server could not be reached: {err}") from err


def dry_run_args(dry_run: bool) -> dict[str, Any]:
    """The query parameter of a server-side dry run: validated, admitted, never stored."""
    return {"dry_run": "All"} if dry_run else {}


def merge_patch_node(api: client.ApiClient, name: str, body: dict[str, Any],
                     dry_run: bool) -> Awaitable[Any]:
    # The client picks strategic-merge for a dict body; a merge patch replaces the taint list
    # whole (guarded by the resourceVersion in the body). Its stubs omit `_content_type`.
    patch: Any = client.CoreV1Api(api).patch_node
    return patch(name, body, _content_type=MERGE_PATCH, **dry_run_args(dry_run))  # type: ignore[no-any-return]


def merge_patch_pod(api: client.ApiClient, namespace: str, name: str,
                    body: dict[str, Any]) -> Awaitable[Any]:
    """A JSON merge patch of a pod (its annotations: the checkpoint request)."""
    patch: Any = client.CoreV1Api(api).patch_namespaced_pod
    return patch(name, namespace, body, _content_type=MERGE_PATCH)  # type: ignore[no-any-return]


def as_json(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    """A model object as the API serialises it (camelCase keys), for the pure decisions."""
    data = api.sanitize_for_serialization(obj)
    assert isinstance(data, dict)
    return data
