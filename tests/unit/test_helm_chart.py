"""The Helm chart (deploy/helm/clusterwarden), rendered by the real helm: `helm lint` passes;
every process the launcher runs is a Deployment, run as the launcher runs it, with its probes;
the agent is a DaemonSet for GPU nodes; the RBAC is deploy/kubernetes/rbac.yaml's; the
ConfigMaps and Secrets hold what the services read, in the form their settings parse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.settings import ServiceSettings
from services.analyzer.settings import AnalyzerSettings
from tests.helm import CHART, TEMPLATES, Helm, by_kind, container, env_of, install_values
from warden import launcher

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
RELEASE, NAMESPACE = "cw", "gpu-ops"
PREFIX = f"{RELEASE}-clusterwarden"


@pytest.fixture
def helm(helm_binary: str, tmp_path: Path) -> Helm:
    return Helm(helm_binary, tmp_path)


@pytest.fixture
def rendered(helm: Helm) -> list[dict[str, Any]]:
    return helm.template(install_values(), release=RELEASE, namespace=NAMESPACE)


def rbac_yaml(kind: str) -> dict[str, Any]:
    found = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == kind)
    assert isinstance(found, dict)
    return found


def test_helm_lint_passes_strict(helm: Helm) -> None:
    answer = helm.run("lint", "--strict", str(CHART), "--values",
                      helm.values_file(install_values()))
    assert "1 chart(s) linted, 0 chart(s) failed" in answer.stdout


def test_the_chart_refuses_a_kubernetes_older_than_1_28(helm: Helm) -> None:
    values = helm.values_file(install_values())
    old = helm.run("template", "cw", str(CHART), "--values", values, "--kube-version",
                   "1.27.9", check=False)
    assert old.returncode != 0
    assert "kubeVersion" in old.stderr
    assert helm.run("template", "cw", str(CHART), "--values", values, "--kube-version",
                    "1.28.0").returncode == 0


def test_the_chart_refuses_to_render_without_the_signing_keys(helm: Helm) -> None:
    values = install_values(signingKeys={"privateKey": "", "publicKey": ""})
    answer = helm.run("template", "cw", str(CHART), "--values", helm.values_file(values),
                      check=False)
    assert answer.returncode != 0
    assert "signingKeys.privateKey" in answer.stderr


def test_every_process_is_a_deployment_run_as_the_launcher_runs_it(
        rendered: list[dict[str, Any]]) -> None:
    deployments = by_kind(rendered, "Deployment")
    assert set(deployments) == {f"{PREFIX}-{name}" for name in launcher.PROCESSES}
    for name in launcher.PROCESSES:
        command = container(deployments[f"{PREFIX}-{name}"])["command"]
        # `faststream ...` is FastStream's script for `python -m faststream ...`.
        as_module = command[1:] if command[0] == "python" else ["-m", *command]
        assert as_module == launcher.service_command(name)[1:], name


def test_every_deployment_has_its_replicas_resources_and_probes(
        rendered: list[dict[str, Any]]) -> None:
    for name, deployment in by_kind(rendered, "Deployment").items():
        spec = container(deployment)
        assert deployment["spec"]["replicas"] == 1
        assert spec["resources"]["requests"]["cpu"], name
        assert spec["image"] == "clusterwarden:0.1.0", name


def test_every_process_is_probed_on_its_health_endpoints(
        rendered: list[dict[str, Any]]) -> None:
    """Liveness on /livez, readiness on /readyz, on the port the process serves them on: the
    API's own, every other service's WARDEN_HEALTH_PORT (on every address, for the kubelet)."""
    for name, deployment in by_kind(rendered, "Deployment").items():
        service = name.removeprefix(f"{PREFIX}-")
        spec = container(deployment)
        port = "http" if service == launcher.API else "health"
        assert spec["livenessProbe"]["httpGet"] == {"path": "/livez", "port": port}, name
        assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}, name
        for probe in ("livenessProbe", "readinessProbe"):
            # Above the 2 s each dependency check may take: a probe never times out first.
            assert spec[probe]["timeoutSeconds"] > 2, name
            assert "exec" not in spec[probe], name
        (declared,) = spec["ports"]
        assert declared["name"] == port, name
        env = env_of(deployment)
        if service == launcher.API:
            assert declared["containerPort"] == int(env["API_PORT"]) == 18080
            assert "WARDEN_HEALTH_PORT" not in env
        else:
            assert declared["containerPort"] == int(env["WARDEN_HEALTH_PORT"]) == 18081, name
            assert env["WARDEN_HEALTH_HOST"] == "0.0.0.0", name


def test_the_health_port_and_probe_timings_are_values(helm: Helm,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = helm.template(install_values(
        healthPort=19999, probes={"liveness": {"periodSeconds": 30, "failureThreshold": 5}}))
    deployment = by_kind(rendered, "Deployment")[f"{PREFIX}-scheduler"]
    scheduler = container(deployment)
    assert scheduler["ports"] == [{"name": "health", "containerPort": 19999}]
    # What the service reads of its environment: the port the probes ask.
    for variable in ("WARDEN_HEALTH_PORT", "WARDEN_HEALTH_HOST"):
        monkeypatch.setenv(variable, env_of(deployment)[variable])
    settings = ServiceSettings()
    assert (settings.health_host, settings.health_port) == ("0.0.0.0", 19999)
    liveness = scheduler["livenessProbe"]
    assert (liveness["periodSeconds"], liveness["failureThreshold"]) == (30, 5)
    # The timings not given keep the chart's.
    assert liveness["timeoutSeconds"] == 3
    assert scheduler["readinessProbe"]["periodSeconds"] == 10


def test_the_image_tag_is_the_pinned_release(helm: Helm) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == chart["appVersion"] != "latest"
    rendered = helm.template(install_values(image={"repository": "r.example/cw", "tag": "9.9.9"}))
    images = {container(w)["image"] for w in rendered if w["kind"] in ("Deployment", "DaemonSet")}
    assert images == {"r.example/cw:9.9.9"}


def test_the_agent_is_a_daemonset_for_gpu_nodes(rendered: list[dict[str, Any]]) -> None:
    (agent,) = by_kind(rendered, "DaemonSet").values()
    pod = agent["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # ClusterWarden's own taint is tolerated: an offline node's agent reports the repair.
    assert {"key": "clusterwarden.io/unhealthy", "operator": "Exists"} in pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    env = env_of(agent)
    # The agent asks the kubelet at the socket of that mount which GPUs each pod holds.
    mounts = {m["name"]: m["mountPath"] for m in container(agent)["volumeMounts"]}
    assert env["AGENT_POD_RESOURCES_SOCKET"] == f"{mounts['pod-resources']}/kubelet.sock"
    assert env["AGENT_JOBS"] == "kube"
    assert env["AGENT_NODE_ID"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["AGENT_TRUSTED_KEYS"] == "/etc/clusterwarden/keys/command-signing.pub"
    assert container(agent)["livenessProbe"]["tcpSocket"] == {"port": "peer-probe"}
    # The agent may not take a GPU from the workloads it reports.
    assert "nvidia.com/gpu" not in json.dumps(container(agent)["resources"])
    assert pod["serviceAccountName"] == f"{PREFIX}-agent"


def test_the_charts_rules_are_those_of_rbac_yaml() -> None:
    chart_rules = yaml.safe_load((CHART / "files" / "backend-rules.yaml").read_text())
    assert chart_rules == rbac_yaml("ClusterRole")["rules"]


def test_the_rbac_is_deploy_kubernetes_rbac_yaml(rendered: list[dict[str, Any]]) -> None:
    role = by_kind(rendered, "ClusterRole")[f"{PREFIX}-backend"]
    assert role["rules"] == rbac_yaml("ClusterRole")["rules"]
    binding = by_kind(rendered, "ClusterRoleBinding")[f"{PREFIX}-backend"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": f"{PREFIX}-backend"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{PREFIX}-backend",
                                    "namespace": NAMESPACE}]
    assert f"{PREFIX}-backend" in by_kind(rendered, "ServiceAccount")


def test_only_the_executor_the_inventory_and_the_agents_get_api_credentials(
        rendered: list[dict[str, Any]]) -> None:
    for name, deployment in by_kind(rendered, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        if name == f"{PREFIX}-executor":
            assert pod["serviceAccountName"] == f"{PREFIX}-backend"
        elif name == f"{PREFIX}-inventory":
            assert pod["serviceAccountName"] == f"{PREFIX}-inventory"
        else:
            assert pod["automountServiceAccountToken"] is False, name
    agent_role = by_kind(rendered, "ClusterRole")[f"{PREFIX}-agent"]
    verbs = {v for rule in agent_role["rules"] for v in rule["verbs"]}
    assert verbs == {"list", "watch"}
    # The inventory only reads.
    inventory_role = by_kind(rendered, "ClusterRole")[f"{PREFIX}-inventory"]
    assert {v for rule in inventory_role["rules"] for v in rule["verbs"]} == {
        "list", "watch", "get"}
    binding = by_kind(rendered, "ClusterRoleBinding")[f"{PREFIX}-inventory"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{PREFIX}-inventory",
                                    "namespace": NAMESPACE}]


def test_the_ranges_configmap_is_what_the_analyzer_reads(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    ranges = {"scale": {"low_enter": 10, "low_exit": 15, "high_enter": 90, "high_exit": 85},
              "loadBalance": {"hold_s": 30},
              "overrides": {"gpu-east/a100": {"scale": {"high_enter": 95}}}}
    rendered = helm.template(install_values(ranges=ranges))
    data = by_kind(rendered, "ConfigMap")["cw-clusterwarden-ranges"]["data"]
    for variable, value in data.items():
        monkeypatch.setenv(variable, value)
    settings = AnalyzerSettings()
    assert (settings.scale.low_enter, settings.scale.high_enter) == (10, 90)
    assert settings.load_balance.hold_s == 30
    assert settings.ranges_for("gpu-east", "a100").pool.high_enter == 95
    readers = {name for name, d in by_kind(rendered, "Deployment").items()
               if {"configMapRef": {"name": "cw-clusterwarden-ranges"}}
               in container(d)["envFrom"]}
    assert readers == {"cw-clusterwarden-analyzer", "cw-clusterwarden-api"}


def test_the_templates_configmap_is_the_templater_and_apis_seed_folder(
        rendered: list[dict[str, Any]]) -> None:
    data = by_kind(rendered, "ConfigMap")[f"{PREFIX}-templates"]["data"]
    assert data == {p.name: p.read_text() for p in sorted(TEMPLATES.glob("*.yaml"))}
    for name in ("templater", "api"):
        deployment = by_kind(rendered, "Deployment")[f"{PREFIX}-{name}"]
        assert env_of(deployment)["TEMPLATER_TEMPLATE_DIR"] == "/etc/clusterwarden/templates"
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"name": "templates", "configMap": {"name": f"{PREFIX}-templates"}} in volumes


def test_the_secrets_hold_the_keys_tokens_and_connections(rendered: list[dict[str, Any]]) -> None:
    secrets = by_kind(rendered, "Secret")
    keys = secrets[f"{PREFIX}-keys"]["stringData"]
    assert keys["command-signing.key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert keys["command-signing.pub"].startswith("-----BEGIN PUBLIC KEY-----")
    assert secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"].endswith(":admin:admin\n")
    assert set(secrets[f"{PREFIX}-connections"]["stringData"]) == {"REDIS_URL", "DATABASE_URL"}
    deployments = by_kind(rendered, "Deployment")
    signers = {name: env_of(deployments[f"{PREFIX}-{name}"])
               for name in ("collector", "executor", "router")}
    for name, env in signers.items():
        assert env[f"{name.upper()}_SIGNING_KEY"] == "/etc/clusterwarden/keys/command-signing.key"
    for deployment in deployments.values():
        assert {"secretRef": {"name": f"{PREFIX}-connections"}} in container(deployment)["envFrom"]


def test_external_servers_and_secrets_of_ones_own(helm: Helm) -> None:
    rendered = helm.template(install_values(
        kafka={"bootstrapServers": "k1:9092,k2:9092"}, connectionsSecret="mine",
        keysSecret="my-keys", tokensSecret="my-tokens"))
    assert by_kind(rendered, "Secret") == {}
    env = by_kind(rendered, "ConfigMap")["cw-clusterwarden-env"]["data"]
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "k1:9092,k2:9092"
    assert env["CAPACITY_PROVIDER"] == "none"
    api = by_kind(rendered, "Deployment")["cw-clusterwarden-api"]
    assert {"secretRef": {"name": "mine"}} in container(api)["envFrom"]
