"""The test API server reports the Kubernetes release deploy/local/kubernetes.sh builds, as a
released one does (the build stamps the version in): version checks against it, such as the
Helm chart's kubeVersion, test what they would on a real cluster."""

from __future__ import annotations

import re
from pathlib import Path

from kubernetes_asyncio import client

from services.backends.kubernetes.connection import KubeAccess, connect

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "local" / "kubernetes.sh"


def built_version() -> str:
    found = re.search(r"^K8S_VERSION=(v\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert found is not None, "kubernetes.sh names no K8S_VERSION"
    return found.group(1)


async def test_the_api_server_reports_the_release_it_was_built_from(
        kube_api: KubeAccess) -> None:
    api = await connect(kube_api)
    try:
        info = await client.VersionApi(api).get_code()
    finally:
        await api.close()
    version = built_version()
    assert info.git_version == version
    assert (info.major, info.minor) == ("1", version.split(".")[1])
