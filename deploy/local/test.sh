#!/usr/bin/env bash
# `make test`: starts Kafka, Redis and PostgreSQL if they are not running, installs chromium,
# runs lint, type checks, unit, contract and integration tests, and stops what it started
# (even when a test fails).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${ROOT}"
# shellcheck source=deploy/local/env.sh
source deploy/local/env.sh
BIN="${ROOT}/.venv/bin"

COMPONENT="$(basename "$0" .sh)"
# shellcheck source=deploy/local/common.sh
source deploy/local/common.sh
start_missing_services
# The console's browser test drives Debian's chromium (installed here when missing).
deploy/local/chromium.sh >/dev/null

echo "== lint (ruff)"
"${BIN}/ruff" check .
echo "== type check (mypy --strict)"
"${BIN}/mypy"
echo "== tests (unit, contract, integration against ${KAFKA_BOOTSTRAP_SERVERS} and ${REDIS_URL})"
"${BIN}/python" -m pytest "$@"
