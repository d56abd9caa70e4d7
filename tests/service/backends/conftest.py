"""The Kubernetes backend opened on the real API server, as the admin or as a service account."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.backends.budget import TokenBucket
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.connection import KubeAccess


@pytest.fixture
def budget() -> TokenBucket:
    return TokenBucket(rate_per_s=20.0, burst=5)


@pytest.fixture
async def backend(kube_api: KubeAccess, budget: TokenBucket) -> AsyncIterator[KubernetesBackend]:
    opened = await KubernetesBackend.open(kube_api, budget)
    try:
        yield opened
    finally:
        await opened.close()
