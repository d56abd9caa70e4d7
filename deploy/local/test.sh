#!/usr/bin/env bash
# `make test`: starts Kafka, Redis, PostgreSQL, Alertmanager and Kubernetes if they are not
# running, installs chromium, runs lint, type checks, unit, contract and integration tests,
# and stops what it started (even when a test fails).
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
# The console's browser tests drive Debian's chromium (installed here when missing), the very
# browser checked here: the tests' `chromium` fixture reads CHROMIUM.
CHROMIUM="$(deploy/local/chromium.sh)"
export CHROMIUM

echo "== lint (ruff)"
"${BIN}/ruff" check .
echo "== type check (mypy --strict)"
"${BIN}/mypy"
echo "== tests (unit, service, integration, browser against ${KAFKA_BOOTSTRAP_SERVERS}, ${REDIS_URL}, ${DATABASE_URL_POSTGRES} and ${CHROMIUM})"
# --complete: the run fails if a kind of test ran no test or a test was skipped without a
# reviewed reason (tests/suite.py), so a missing service can never pass as green.
"${BIN}/python" -m pytest --complete "$@"
