#!/usr/bin/env bash
# `make test`: starts Kafka and Redis if they are not running, runs lint, type checks, unit,
# contract and integration tests, and stops what it started (even when a test fails).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
BIN="${ROOT}/.venv/bin"

started=()
cleanup() {
  for svc in "${started[@]}"; do
    "deploy/local/${svc}.sh" stop || true
  done
}
trap cleanup EXIT

for svc in kafka redis; do
  if ! "deploy/local/${svc}.sh" status >/dev/null 2>&1; then
    "deploy/local/${svc}.sh" start
    started+=("${svc}")
  fi
done

echo "== lint (ruff)"
"${BIN}/ruff" check .
echo "== type check (mypy --strict)"
"${BIN}/mypy"
echo "== tests (unit, contract, integration against ${KAFKA_BOOTSTRAP_SERVERS} and ${REDIS_URL})"
"${BIN}/python" -m pytest "$@"
