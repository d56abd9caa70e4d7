"""The Helm chart (deploy/helm/clusterwarden), rendered by the real helm: `helm lint` passes;
every process the launcher runs is a Deployment, run as the launcher runs it, with its probes;
the agent is a DaemonSet for GPU nodes; the RBAC is deploy/kubernetes/rbac.yaml's; the
ConfigMaps and Secrets hold what the services read, in the form their settings parse.

The secrets: each signer mounts its own private key and no other, the agents the three public
keys (each trusted for its role) and nothing of the keys Secret; every service has the audit
key; report MACs are required and the agents enrol themselves with a bootstrap token the API
knows by its digest; with SASL_SSL or SSL each pod is its own Kafka principal; a missing or
malformed value stops the rendering with its name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from agent.settings import AgentSettings
from common.settings import ReportReaderSettings, ServiceSettings
from common.signing import SIGNER_ROLES, public_pem, registry_from_files
from schemas.access import Principal
from services.analyzer.settings import AnalyzerSettings
from services.api.auth import Principal as Caller
from services.api.auth import load_tokens, token_lines
from tests.helm import (
    CHART,
    TEMPLATES,
    Helm,
    by_kind,
    container,
    env_of,
    files_of,
    install_values,
    secret_names,
    signing_pair,
    volumes_of,
)
from warden import launcher

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
RELEASE, NAMESPACE = "cw", "gpu-ops"
PREFIX = f"{RELEASE}-clusterwarden"
KEYS, AGENT_SECRET, KAFKA_SECRET = f"{PREFIX}-keys", f"{PREFIX}-agent", f"{PREFIX}-kafka"
# Whose pods hold the report master: the readers of reports and answers, and the API, which
# enrols nodes under it.
MASTER_HOLDERS = {"collector", "router", "executor", "api"}
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# A report master of 37 bytes, base64 without padding.
MASTER = "c2l4dGVlbi1ieXRlcy1vZi1ub3RoaW5nLWF0LWFsbC0xMjM0NQ"
# The one pair shared by every signer that chart 0.1.0 took.
SHARED_PRIVATE, SHARED_PUBLIC = signing_pair()


@pytest.fixture
def helm(helm_binary: str, tmp_path: Path) -> Helm:
    return Helm(helm_binary, tmp_path)


@pytest.fixture
def rendered(helm: Helm) -> list[dict[str, Any]]:
    return helm.template(install_values(), release=RELEASE, namespace=NAMESPACE)


def service_deployments(rendered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Deployments by service name."""
    return {name.removeprefix(f"{PREFIX}-"): d
            for name, d in by_kind(rendered, "Deployment").items()}


def the_agent(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    (agent,) = by_kind(rendered, "DaemonSet").values()
    return agent


def refusal(helm: Helm, values: dict[str, Any]) -> str:
    """Why `helm template` refuses `values` (it must)."""
    answer = helm.run("template", "cw", str(CHART), "--values", helm.values_file(values),
                      check=False)
    assert answer.returncode != 0, "rendered"
    return answer.stderr


def caller_of(token: str, secrets: dict[str, dict[str, Any]], tmp_path: Path) -> object:
    """Whom the API takes `token` for, with the rendered tokens Secret as its tokens file."""
    tokens_file = tmp_path / "api-tokens"
    tokens_file.write_text(secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"])
    return load_tokens("", str(tokens_file)).authenticate(token, datetime.now(UTC))


def kafka_users(**fields: str) -> dict[str, dict[str, str]]:
    """Credentials for every principal of schemas/access.py, each its own."""
    return {p.value: {field: f"{value}-{p.value}" for field, value in fields.items()}
            for p in Principal}


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
    assert env["AGENT_TRUSTED_KEYS"] == mounts["trust"]
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
    assert set(keys) == {"executor.key", "collector.key", "router.key", "report-master.key",
                         "audit-key"}
    for role in SIGNER_ROLES:
        assert keys[f"{role}.key"].startswith("-----BEGIN PRIVATE KEY-----")
    agent = secrets[f"{PREFIX}-agent"]["stringData"]
    assert set(agent) == {"executor.pub", "collector.pub", "router.pub", "bootstrap.token"}
    assert secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"].startswith(
        "sha256=" + "0" * 64 + ":admin:admin\n")
    assert set(secrets[f"{PREFIX}-connections"]["stringData"]) == {"REDIS_URL", "DATABASE_URL"}
    for deployment in by_kind(rendered, "Deployment").values():
        assert {"secretRef": {"name": f"{PREFIX}-connections"}} in container(deployment)["envFrom"]


def test_external_servers_and_secrets_of_ones_own(helm: Helm) -> None:
    rendered = helm.template(install_values(
        kafka={"bootstrapServers": "k1:9092,k2:9092"}, connectionsSecret="mine",
        keysSecret="my-keys", tokensSecret="my-tokens", agentSecret="my-agent"))
    assert by_kind(rendered, "Secret") == {}
    env = by_kind(rendered, "ConfigMap")["cw-clusterwarden-env"]["data"]
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "k1:9092,k2:9092"
    assert env["CAPACITY_PROVIDER"] == "none"
    deployments = by_kind(rendered, "Deployment")
    api = deployments["cw-clusterwarden-api"]
    assert {"secretRef": {"name": "mine"}} in container(api)["envFrom"]
    assert volumes_of(api)["tokens"]["secret"]["secretName"] == "my-tokens"
    for deployment in deployments.values():
        assert secret_names(deployment) <= {"mine", "my-keys", "my-tokens"}
        assert env_of(deployment)["WARDEN_AUDIT_KEY"]["secretKeyRef"]["name"] == "my-keys"
    (agent,) = by_kind(rendered, "DaemonSet").values()
    assert secret_names(agent) == {"my-agent"}
    # The agents' own Secret holds their bootstrap token: they enrol.
    assert "AGENT_BOOTSTRAP_TOKEN_FILE" in env_of(agent)


# ------------------------------------------------------------ a signing key per signer


def test_each_signer_mounts_its_own_private_key_and_no_other(
        rendered: list[dict[str, Any]]) -> None:
    secrets = by_kind(rendered, "Secret")
    keys, trusted = secrets[KEYS]["stringData"], secrets[AGENT_SECRET]["stringData"]
    for name, deployment in service_deployments(rendered).items():
        files = files_of(deployment)
        held = {key for secret, key in files.values() if secret == KEYS}
        own = {f"{name}.key"} if name in SIGNER_ROLES else set()
        master = {"report-master.key"} if name in MASTER_HOLDERS else set()
        assert held == own | master, name
        env = env_of(deployment)
        assert {r for r in SIGNER_ROLES if f"{r.upper()}_SIGNING_KEY" in env} == (
            {name} & set(SIGNER_ROLES)), name
        if own:
            # The file its setting names is its own key, the pair of the one the agents
            # trust for its role.
            assert files[env[f"{name.upper()}_SIGNING_KEY"]] == (KEYS, f"{name}.key")
            private = load_pem_private_key(keys[f"{name}.key"].encode(), password=None)
            assert isinstance(private, Ed25519PrivateKey)
            assert public_pem(private.public_key()).decode() == trusted[f"{name}.pub"]


def test_the_agents_trust_the_three_public_keys_each_for_its_role_and_hold_no_private_key(
        rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    agent = the_agent(rendered)
    files = files_of(agent)
    folder = env_of(agent)["AGENT_TRUSTED_KEYS"]
    in_folder = {path.removeprefix(folder + "/"): source for path, source in files.items()
                 if path.startswith(folder + "/")}
    assert in_folder == {f"{role}.pub": (AGENT_SECRET, f"{role}.pub") for role in SIGNER_ROLES}
    # The agent names no Secret but its own (its node's kubelet may read each it names,
    # whole): not the keys Secret, nor the connections Secret, whose URLs carry passwords.
    assert KEYS not in secret_names(agent)
    assert secret_names(agent) == {AGENT_SECRET}
    held = by_kind(rendered, "Secret")[AGENT_SECRET]["stringData"]
    assert not any("PRIVATE KEY" in text for text in held.values())
    assert "WARDEN_AUDIT_KEY" not in env_of(agent)
    # What the agent makes of that folder: each key trusted for its own signer's actions.
    for name, text in held.items():
        if name.endswith(".pub"):
            (tmp_path / name).write_text(text)
    registry = registry_from_files([tmp_path])
    assert sorted(key.role for key in registry.keys.values()) == sorted(SIGNER_ROLES)
    by_role = {key.role: key.kid for key in registry.keys.values()}
    assert registry.refusal(by_role["collector"], "drain_node") == "action_not_allowed"
    assert registry.refusal(by_role["executor"], "drain_node") is None


# ------------------------------------------------------------ the audit key


def test_every_service_gets_the_audit_key_from_the_keys_secret(
        rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    audit_key = by_kind(rendered, "Secret")[KEYS]["stringData"]["audit-key"]
    for name, deployment in service_deployments(rendered).items():
        assert env_of(deployment)["WARDEN_AUDIT_KEY"] == {
            "secretKeyRef": {"name": KEYS, "key": "audit-key"}}, name
    monkeypatch.setenv("WARDEN_AUDIT_KEY", audit_key)
    assert ServiceSettings().audit_key.get_secret_value() == audit_key


# ------------------------------------------------------------ report MACs and enrolment


def test_report_macs_are_required_by_default_and_the_agents_enrol_themselves(
        rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["reportAuth"]["requireMac"] is True
    env = by_kind(rendered, "ConfigMap")[f"{PREFIX}-env"]["data"]
    monkeypatch.setenv("WARDEN_REQUIRE_REPORT_MAC", env["WARDEN_REQUIRE_REPORT_MAC"])
    assert ReportReaderSettings().require_report_mac is True
    # The report master is where each holder's setting names it.
    for name, deployment in service_deployments(rendered).items():
        path = env_of(deployment).get("WARDEN_REPORT_MASTER_KEY")
        assert (path is not None) == (name in MASTER_HOLDERS), name
        if path is not None:
            assert files_of(deployment)[path] == (KEYS, "report-master.key")
    # The agent: the bootstrap token at its setting, the API's Service as the API to enrol at.
    secrets = by_kind(rendered, "Secret")
    token = secrets[AGENT_SECRET]["stringData"]["bootstrap.token"]
    agent = the_agent(rendered)
    agent_env = env_of(agent)
    assert files_of(agent)[agent_env["AGENT_BOOTSTRAP_TOKEN_FILE"]] == (
        AGENT_SECRET, "bootstrap.token")
    service = by_kind(rendered, "Service")[f"{PREFIX}-api"]
    port = service["spec"]["ports"][0]["port"]
    assert agent_env["AGENT_API_URL"] == f"http://{PREFIX}-api.{NAMESPACE}.svc:{port}"
    # The API knows the token as a node's, by its digest only.
    entries = secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"]
    assert token not in entries
    assert caller_of(token, secrets, tmp_path) == Caller("node-bootstrap", "node")
    # The key it is handed lands in its state folder, the host path kept across restarts.
    for variable in ("AGENT_STATE_DIR", "AGENT_BOOTSTRAP_TOKEN_FILE", "AGENT_API_URL"):
        monkeypatch.setenv(variable, agent_env[variable])
    settings = AgentSettings(node_id="gpu-node-1")
    mounts = {m["name"]: m["mountPath"] for m in container(agent)["volumeMounts"]}
    assert settings.report_key_path().parent == Path(mounts["state"])
    assert volumes_of(agent)["state"]["hostPath"]["path"] == "/var/lib/clusterwarden"


def test_with_macs_not_required_the_bootstrap_token_may_be_left_out(helm: Helm) -> None:
    """The step of an upgrade whose nodes get their keys by hand (docs/helm.md, Upgrading):
    no token, no enrolment, unsigned reports accepted."""
    rendered = helm.template(install_values(
        reportAuth={"requireMac": False, "masterKey": MASTER}))
    env = by_kind(rendered, "ConfigMap")[f"{PREFIX}-env"]["data"]
    assert env["WARDEN_REQUIRE_REPORT_MAC"] == "false"
    agent = the_agent(rendered)
    assert {"AGENT_BOOTSTRAP_TOKEN_FILE", "AGENT_API_URL"}.isdisjoint(env_of(agent))
    assert "bootstrap" not in volumes_of(agent)
    secrets = by_kind(rendered, "Secret")
    assert "bootstrap.token" not in secrets[AGENT_SECRET]["stringData"]
    assert ":node" not in secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"]


def test_the_agents_enrol_through_an_api_url_of_ones_own(helm: Helm) -> None:
    rendered = helm.template(install_values(agent={"apiUrl": "https://warden.example:443"}))
    assert env_of(the_agent(rendered))["AGENT_API_URL"] == "https://warden.example:443"


def without(role: str, field: str) -> dict[str, Any]:
    """Values with one signer's key left out."""
    values = install_values()
    values["signingKeys"][role][field] = ""
    return values


@pytest.mark.parametrize(("values", "named"), [
    *[(without(role, "privateKey"), f"signingKeys.{role}.privateKey") for role in SIGNER_ROLES],
    *[(without(role, "publicKey"), f"signingKeys.{role}.publicKey") for role in SIGNER_ROLES],
    (install_values(auditKey=""), "auditKey: the audit chains' key"),
    (install_values(auditKey="x" * 31), "auditKey: at least 32 characters"),
    (install_values(reportAuth={"bootstrapToken": "t" * 32}), "reportAuth.masterKey"),
    (install_values(reportAuth={"masterKey": "c2hvcnQ", "bootstrapToken": "t" * 32}),
     "reportAuth.masterKey: base64 of at least 32"),
    (install_values(reportAuth={"masterKey": MASTER}), "reportAuth.bootstrapToken"),
    (install_values(reportAuth={"masterKey": MASTER, "bootstrapToken": "short"}),
     "reportAuth.bootstrapToken: at least 16"),
    (install_values(reportAuth={"masterKey": MASTER, "bootstrapToken": "a:b" * 10}),
     "reportAuth.bootstrapToken: at least 16"),
    # The one shared pair of 0.1.0 is refused by name, not silently ignored.
    (install_values(signingKeys={"privateKey": SHARED_PRIVATE, "publicKey": SHARED_PUBLIC}),
     "signingKeys.privateKey/publicKey (one pair shared by every signer) are no longer read"),
    (install_values(kafka={"securityProtocol": "SASL_PLAINTEXT"}), "kafka.securityProtocol"),
    (install_values(kafka={"securityProtocol": "SASL_SSL", "saslMechanism": "GSSAPI",
                           "users": kafka_users(password="pw")}), "kafka.saslMechanism"),
    (install_values(kafka={"securityProtocol": "SASL_SSL",
                           "users": {"agent": {"password": "pw"}}}),
     "kafka.users.alerts.password"),
    (install_values(kafka={"securityProtocol": "SASL_SSL", "credentialsSecret": "mine"}),
     "kafka.users.agent.password"),
    (install_values(kafka={"securityProtocol": "SSL", "users": {
        p.value: {"cert": "C"} for p in Principal}}), ".key: the key of the"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_missing_or_malformed_value_is_refused_by_name(
        helm: Helm, values: dict[str, Any], named: str) -> None:
    assert named in refusal(helm, values)


def test_a_keys_secret_of_ones_own_needs_no_private_key_in_the_values(helm: Helm) -> None:
    public_only = {role: {"privateKey": "", "publicKey": pair["publicKey"]}
                   for role, pair in install_values()["signingKeys"].items()}
    rendered = helm.template(install_values(signingKeys=public_only, auditKey="",
                                            keysSecret="my-keys"))
    assert KEYS not in by_kind(rendered, "Secret")
    executor = service_deployments(rendered)["executor"]
    assert {key for name, key in files_of(executor).values() if name == "my-keys"} == {
        "executor.key", "report-master.key"}


# ------------------------------------------------------------ Kafka: a principal per pod


def test_with_sasl_ssl_each_service_is_its_own_principal_with_its_own_password(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    users = kafka_users(password="pw")
    rendered = helm.template(install_values(kafka={
        "securityProtocol": "SASL_SSL", "caCert": CA_PEM, "users": users}),
        release=RELEASE, namespace=NAMESPACE)
    shared = by_kind(rendered, "ConfigMap")[f"{PREFIX}-env"]["data"]
    assert (shared["KAFKA_SECURITY_PROTOCOL"], shared["KAFKA_SASL_MECHANISM"]) == (
        "SASL_SSL", "SCRAM-SHA-512")
    assert by_kind(rendered, "ConfigMap")[f"{PREFIX}-kafka-ca"]["data"] == {"ca.pem": CA_PEM}
    secrets = by_kind(rendered, "Secret")
    workloads = {**service_deployments(rendered), "agent": the_agent(rendered)}
    assert set(workloads) == {p.value for p in Principal} - {"admin"}
    for principal, workload in workloads.items():
        held = AGENT_SECRET if principal == "agent" else KAFKA_SECRET
        env = env_of(workload)
        assert env["KAFKA_SASL_USERNAME"] == principal
        assert env["KAFKA_SASL_PASSWORD"] == {
            "secretKeyRef": {"name": held, "key": f"{principal}-password"}}, principal
        assert secrets[held]["stringData"][f"{principal}-password"] == f"pw-{principal}"
        assert files_of(workload)[env["KAFKA_SSL_CAFILE"]] == (f"{PREFIX}-kafka-ca", "ca.pem")
        # What the service makes of it: a SASL_SSL connection as its own principal.
        for variable, value in shared.items():
            monkeypatch.setenv(variable, value)
        for variable in ("KAFKA_SASL_USERNAME", "KAFKA_SSL_CAFILE"):
            monkeypatch.setenv(variable, env[variable])
        monkeypatch.setenv("KAFKA_SASL_PASSWORD", users[principal]["password"])
        settings = ServiceSettings()
        assert (settings.kafka_security_protocol, settings.kafka_sasl_username) == (
            "SASL_SSL", principal)
    # The agents' password is never in the services' Secret, nor theirs in the agents'.
    assert "agent-password" not in secrets[KAFKA_SECRET]["stringData"]
    assert [k for k in secrets[AGENT_SECRET]["stringData"] if k.endswith("-password")] == [
        "agent-password"]


def test_with_ssl_each_pod_mounts_its_own_client_certificate(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    users = kafka_users(cert="CERT", key="KEY")
    rendered = helm.template(install_values(kafka={
        "securityProtocol": "SSL", "caCert": CA_PEM, "users": users}))
    shared = by_kind(rendered, "ConfigMap")[f"{PREFIX}-env"]["data"]
    assert shared["KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert "KAFKA_SASL_MECHANISM" not in shared
    secrets = by_kind(rendered, "Secret")
    workloads = {**service_deployments(rendered), "agent": the_agent(rendered)}
    for principal, workload in workloads.items():
        held = AGENT_SECRET if principal == "agent" else KAFKA_SECRET
        env, files = env_of(workload), files_of(workload)
        assert "KAFKA_SASL_USERNAME" not in env
        assert files[env["KAFKA_SSL_CERTFILE"]] == (held, f"{principal}-cert"), principal
        assert files[env["KAFKA_SSL_KEYFILE"]] == (held, f"{principal}-key"), principal
        # No other principal's certificate or key.
        kafka_files = {key for name, key in files.values() if name == held
                       and key.endswith(("-cert", "-key"))}
        assert kafka_files == {f"{principal}-cert", f"{principal}-key"}, principal
        assert secrets[held]["stringData"][f"{principal}-key"].strip() == f"KEY-{principal}"
    for variable in ("KAFKA_SECURITY_PROTOCOL", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE"):
        monkeypatch.setenv(variable, {**shared, **env_of(workloads["executor"])}[variable])
    assert ServiceSettings().kafka_ssl_certfile == "/etc/clusterwarden/kafka/client.crt"


def test_plaintext_renders_nothing_of_kafka_authentication(helm: Helm) -> None:
    # A CA and credentials given but PLAINTEXT (the default) chosen: none of it is used.
    rendered = helm.template(install_values(kafka={
        "caCert": CA_PEM, "users": kafka_users(password="pw")}))
    assert {f"{PREFIX}-kafka-ca", KAFKA_SECRET}.isdisjoint(
        by_kind(rendered, "ConfigMap") | by_kind(rendered, "Secret"))
    shared = by_kind(rendered, "ConfigMap")[f"{PREFIX}-env"]["data"]
    assert [k for k in shared if k.startswith("KAFKA_")] == ["KAFKA_BOOTSTRAP_SERVERS"]
    assert "agent-password" not in by_kind(rendered, "Secret")[AGENT_SECRET]["stringData"]
    for workload in [*by_kind(rendered, "Deployment").values(), the_agent(rendered)]:
        assert not [k for k in env_of(workload) if k.startswith("KAFKA_")]
        assert "kafka" not in volumes_of(workload)


def test_kafka_credentials_of_ones_own(helm: Helm) -> None:
    rendered = helm.template(install_values(kafka={
        "securityProtocol": "SASL_SSL", "credentialsSecret": "my-kafka",
        "users": {"agent": {"password": "pw-agent"}}}))
    assert KAFKA_SECRET not in by_kind(rendered, "Secret")
    for name, deployment in service_deployments(rendered).items():
        assert env_of(deployment)["KAFKA_SASL_PASSWORD"] == {
            "secretKeyRef": {"name": "my-kafka", "key": f"{name}-password"}}
    # No CA given: the system's, and no volume for it.
    assert "KAFKA_SSL_CAFILE" not in env_of(service_deployments(rendered)["api"])
    assert "my-kafka" not in secret_names(the_agent(rendered))


def test_the_bootstrap_entry_is_not_added_twice(helm: Helm, tmp_path: Path) -> None:
    """`warden secrets init`'s api-tokens file, given as apiTokens, holds the entry already;
    the API refuses a token configured twice."""
    values = install_values()
    token = values["reportAuth"]["bootstrapToken"]
    _, entry = token_lines(token, "node-bootstrap", "node")
    values["apiTokens"] = f"# made by `warden secrets init`\n{entry}\n"
    secrets = by_kind(helm.template(values), "Secret")
    assert secrets[f"{PREFIX}-api-tokens"]["stringData"]["api-tokens"].count(entry) == 1
    assert caller_of(token, secrets, tmp_path) == Caller("node-bootstrap", "node")


def test_keys_and_tokens_given_as_files_lose_their_newline(helm: Helm, tmp_path: Path) -> None:
    """`--set-file` keeps a file's last newline; the services would take it as part of the
    audit key (the CLI strips the same file), and the token's digest would be another's."""
    values = install_values()
    token, audit_key = values["reportAuth"]["bootstrapToken"], values["auditKey"]
    values["reportAuth"]["bootstrapToken"] += "\n"
    values["auditKey"] += "\n"
    secrets = by_kind(helm.template(values), "Secret")
    assert secrets[KEYS]["stringData"]["audit-key"] == audit_key
    assert secrets[AGENT_SECRET]["stringData"]["bootstrap.token"] == token
    assert caller_of(token, secrets, tmp_path) == Caller("node-bootstrap", "node")
