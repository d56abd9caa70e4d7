"""ClusterWarden's Helm chart (deploy/helm/clusterwarden) as its tests use it: values a test
installation needs, and `helm template` / `helm lint` / `helm install` run with the helm that
deploy/local/helm.sh builds, each in a helm home of the test's own."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.reportauth import MASTER_BYTES
from common.signing import SIGNER_ROLES, b64url
from services.api.auth import new_token

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "clusterwarden"
TEMPLATES = ROOT / "services" / "templater" / "templates"
# A broken chart or API server fails within this; a working one takes seconds.
HELM_TIMEOUT_S = 120


def signing_pair() -> tuple[str, str]:
    """A fresh Ed25519 pair as PEM (private, public), as `warden keys` writes them."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def signing_keys() -> dict[str, dict[str, str]]:
    """A fresh pair per signer, as the chart's signingKeys take them."""
    return {role: dict(zip(("privateKey", "publicKey"), signing_pair(), strict=True))
            for role in SIGNER_ROLES}


def install_values(**overrides: Any) -> dict[str, Any]:
    """The values an installation cannot do without (a key pair per signer, the report
    master, the audit key, the nodes' bootstrap token, an admin token), the built-in templates
    as the templates ConfigMap, and `overrides` on top."""
    values: dict[str, Any] = {
        "signingKeys": signing_keys(),
        "auditKey": secrets.token_urlsafe(32),
        "reportAuth": {"masterKey": b64url(secrets.token_bytes(MASTER_BYTES)),
                       "bootstrapToken": new_token()},
        "apiTokens": "sha256=" + "0" * 64 + ":admin:admin\n",
        "templates": {p.name: p.read_text() for p in sorted(TEMPLATES.glob("*.yaml"))},
    }
    return values | overrides


class Helm:
    """One helm binary with its config, cache and data folders under `home`."""

    def __init__(self, binary: str, home: Path, kubeconfig: str = "") -> None:
        self.binary, self.home, self.kubeconfig = binary, home, kubeconfig

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin",
               "HELM_CONFIG_HOME": str(self.home / "config"),
               "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data")}
        if self.kubeconfig:
            env["KUBECONFIG"] = self.kubeconfig
        answer = subprocess.run([self.binary, *args], env=env, capture_output=True, text=True,
                                timeout=HELM_TIMEOUT_S + 30, check=False)
        if check and answer.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {answer.returncode}:\n"
                                 f"{answer.stderr}{answer.stdout}")
        return answer

    def values_file(self, values: dict[str, Any]) -> str:
        path = self.home / f"values-{len(list(self.home.glob('values-*')))}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(values))
        return str(path)

    def template(self, values: dict[str, Any], *, release: str = "cw",
                 namespace: str = "clusterwarden") -> list[dict[str, Any]]:
        """The rendered objects."""
        out = self.run("template", release, str(CHART), "--namespace", namespace,
                       "--values", self.values_file(values)).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The rendered objects of one kind by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    """The one container of a Deployment or DaemonSet."""
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def env_of(workload: dict[str, Any]) -> dict[str, Any]:
    """A container's `env` by name: the value, or the `valueFrom` source."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}


def volumes_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A pod's volumes by name."""
    return {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}


def files_of(workload: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Every file the container sees from a Secret or ConfigMap: its path -> (the object's
    name, its key); a volume that takes the whole object is one entry, key "*", at its
    mount path."""
    volumes = volumes_of(workload)
    found: dict[str, tuple[str, str]] = {}
    for mount in container(workload).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        sources = list(volume.get("projected", {}).get("sources", []))
        if "secret" in volume:
            sources.append({"secret": volume["secret"] | {"name": volume["secret"]["secretName"]}})
        if "configMap" in volume:
            sources.append({"configMap": volume["configMap"]})
        for source in sources:
            ((_, of),) = source.items()
            items = of.get("items")
            if items is None:
                found[mount["mountPath"]] = (of["name"], "*")
            for item in items or []:
                found[f"{mount['mountPath']}/{item['path']}"] = (of["name"], item["key"])
    return found


def secret_names(workload: dict[str, Any]) -> set[str]:
    """Every Secret a pod names (a node's kubelet may read each of them whole)."""
    spec = container(workload)
    names = {e["secretRef"]["name"] for e in spec.get("envFrom", []) if "secretRef" in e}
    names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in spec.get("env", [])
              if "secretKeyRef" in e.get("valueFrom", {})}
    for volume in volumes_of(workload).values():
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        names |= {s["secret"]["name"] for s in volume.get("projected", {}).get("sources", [])
                  if "secret" in s}
    return names
