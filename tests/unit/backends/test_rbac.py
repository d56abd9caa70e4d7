"""deploy/kubernetes/rbac.yaml grants the Kubernetes backend exactly the verbs it needs (its
service tests show the backend works with them and is refused beyond them)."""

from __future__ import annotations

from pathlib import Path

import yaml

RBAC = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "rbac.yaml"
NEEDED = {
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "pods/eviction"): {"create"},
    ("cluster.x-k8s.io", "machinedeployments"): {"get", "patch"},
    ("cluster.x-k8s.io", "machinedeployments/scale"): {"get", "patch", "update"},
    # Which machines a scale-up added (recorded on them), which a scale-down deletes first.
    ("cluster.x-k8s.io", "machines"): {"get", "list", "patch"},
}


def test_the_cluster_role_grants_exactly_the_needed_verbs() -> None:
    documents = {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text())}
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in documents["ClusterRole"]["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == NEEDED


def test_the_binding_gives_the_role_to_the_service_account() -> None:
    documents = {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text())}
    account, binding = documents["ServiceAccount"], documents["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == documents["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
