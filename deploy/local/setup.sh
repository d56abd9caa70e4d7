#!/usr/bin/env bash
# Installs what ClusterWarden needs on a fresh Debian machine, and nothing that is already there:
# a Python 3.11 virtual environment with the pinned packages, Java and Maven for the Kafka
# broker jars, the jars themselves, redis-server, PostgreSQL, Alertmanager, the Kubernetes
# control plane and helm. Safe to run again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${ROOT}/.venv"
STAMP="${VENV}/.installed"

say() { printf 'setup: %s\n' "$*"; }

apt_install() {
  # Debian packages, installed only where missing; a clear message where that is impossible.
  local missing=()
  for pkg in "$@"; do
    dpkg -s "${pkg}" >/dev/null 2>&1 || missing+=("${pkg}")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null; then
    say "missing Debian packages: ${missing[*]}; install them (apt-get install -y ${missing[*]})"
    exit 1
  fi
  local SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  say "installing ${missing[*]} from Debian packages"
  ${SUDO} apt-get update -qq
  DEBIAN_FRONTEND=noninteractive ${SUDO} apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Java runs the broker, Maven fetches its jars; redis-server holds queues, locks and journals.
command -v java >/dev/null || apt_install openjdk-17-jre-headless
command -v mvn >/dev/null || apt_install maven
command -v redis-server >/dev/null || apt_install redis-server
# PostgreSQL: the task store's production database, which its tests run against too. Debian
# keeps the server off PATH, under /usr/lib/postgresql/<version>/bin (postgres.sh finds it).
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || apt_install postgresql

PYTHON="${PYTHON:-}"
if [[ -z "${PYTHON}" ]]; then
  for candidate in python3.11 python3; do
    if command -v "${candidate}" >/dev/null &&
       "${candidate}" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PYTHON="${candidate}"
      break
    fi
  done
fi
if [[ -z "${PYTHON}" ]]; then
  apt_install python3.11 python3.11-venv
  PYTHON=python3.11
fi

if [[ ! -f "${STAMP}" || "${ROOT}/pyproject.toml" -nt "${STAMP}" ]]; then
  say "creating ${VENV} with ${PYTHON} and installing the pinned packages"
  [[ -x "${VENV}/bin/python" ]] || "${PYTHON}" -m venv "${VENV}"
  "${VENV}/bin/python" -m pip install -q --upgrade pip
  "${VENV}/bin/python" -m pip install -q -e "${ROOT}[test]"
  touch "${STAMP}"
fi

if ! compgen -G "${ROOT}/deploy/kafka/target/libs/kafka_2.13-*.jar" >/dev/null; then
  say "fetching the Kafka broker jars from Maven Central"
  mvn -B -q -f "${ROOT}/deploy/kafka/pom.xml" package
fi
# Prometheus Alertmanager (alerts reach people through it) is a Go program: built once from
# the Go module proxy and cached under the state folder.
"${ROOT}/deploy/local/alertmanager.sh" build
# Prometheus, which scrapes the services' metrics for the dashboards (deploy/grafana): built
# once from the Go module proxy and cached under the state folder.
"${ROOT}/deploy/local/prometheus.sh" build
# Jaeger (the trace backend the one-trace test and local development export to) is a Go
# program too: built once from its module's source on the module proxy, cached.
"${ROOT}/deploy/local/jaeger.sh" build
# The Kubernetes control plane the Kubernetes backend is tested against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok): built once from the Go module proxy, cached.
"${ROOT}/deploy/local/kubernetes.sh" build
# helm, for the chart (deploy/helm/clusterwarden) and its tests: built once from the Go module
# proxy, cached.
"${ROOT}/deploy/local/helm.sh" build
say "ready"
