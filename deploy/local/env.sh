# shellcheck shell=bash
# Source this (`. deploy/local/env.sh`) to point the services and tests at the local broker,
# redis, PostgreSQL, Alertmanager and Kubernetes API server started by deploy/local/kafka.sh,
# redis.sh, postgres.sh, alertmanager.sh and kubernetes.sh.
#
# Every variable is only set when it is not already, so a value exported by CI or by hand wins.
# No `set -euo pipefail` here: options set in a sourced file would leak into the caller's shell.

# Found from this file's location so sourcing works from any working directory.
_warden_repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

export WARDEN_STATE_DIR="${WARDEN_STATE_DIR:-${_warden_repo_root}/.state}"
# Same defaults as kafka.sh and redis.sh, so KAFKA_PORT/REDIS_PORT steer both the same way.
export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:${KAFKA_PORT:-19092}}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:${REDIS_PORT:-16379}/0}"
# The task store's tests run against SQLite and this server (each test in a database of its
# own). The services themselves keep their SQLite default unless DATABASE_URL is set.
export DATABASE_URL_POSTGRES="${DATABASE_URL_POSTGRES:-postgresql+asyncpg://postgres@127.0.0.1:${POSTGRES_PORT:-15432}/warden}"
# Alertmanager, started by deploy/local/alertmanager.sh: the alerts service delivers to it.
export ALERTMANAGER_URL="${ALERTMANAGER_URL:-http://127.0.0.1:${ALERTMANAGER_PORT:-19095}}"
# The admin kubeconfig of the Kubernetes API server deploy/local/kubernetes.sh runs (its port,
# KUBE_APISERVER_PORT, is written inside): the Kubernetes backend's tests act on that cluster.
export KUBECONFIG_CLUSTERWARDEN="${KUBECONFIG_CLUSTERWARDEN:-${WARDEN_STATE_DIR}/kubernetes/admin.kubeconfig}"

unset _warden_repo_root
