#!/usr/bin/env bash
# `make demo`: Kafka, Redis, PostgreSQL, every service and a local fleet of 3 agents; a GPU
# fault on one agent becomes a succeeded offline task, shown as it happens, while ML tasks flow
# through the router and a model made flaky on one node loses its traffic. Ctrl-C stops
# everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh

COMPONENT="$(basename "$0" .sh)"
# shellcheck source=deploy/local/common.sh
source deploy/local/common.sh
start_missing_services

# A namespace and a state folder per demo run, so a second run never replays the first
# one's events nor starts agents whose journals say they were taken offline last time.
export WARDEN_NAMESPACE="${WARDEN_NAMESPACE:-demo$(date +%s)}"
WARDEN_STATE_DIR="${WARDEN_STATE_DIR}/runs/${WARDEN_NAMESPACE}" "${ROOT}/.venv/bin/warden" demo "$@"
