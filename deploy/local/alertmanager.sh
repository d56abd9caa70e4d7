#!/usr/bin/env bash
# Runs Prometheus Alertmanager for local development and the integration tests: the program is
# built once from the Go module proxy (cached under the state folder), the config rendered from
# deploy/alertmanager/alertmanager.yml.in.
#
#   deploy/local/alertmanager.sh build    build the binary if it is not cached yet
#   deploy/local/alertmanager.sh start    build if needed, start (or confirm running), wait ready
#   deploy/local/alertmanager.sh stop     SIGTERM, then SIGKILL
#   deploy/local/alertmanager.sh status   exit 0 if it answers /-/ready, 1 otherwise
#
# Environment:
#   WARDEN_STATE_DIR           state root (default <repo>/.state); binaries in bin/, the
#                              server's files in alertmanager/
#   ALERTMANAGER_PORT          default 19095 (not 9093, so a system Alertmanager never collides;
#                              not 19093, the Kafka controller's port)
#   ALERTMANAGER_WEBHOOK_URL   optional: every notification (firing and resolved) is also
#                              POSTed there
#   ALERTMANAGER_GROUP_WAIT, ALERTMANAGER_GROUP_INTERVAL   default 30s and 5m
set -euo pipefail

COMPONENT=alertmanager
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# v0.28.1: built and run on Go 1.26 from the module proxy.
ALERTMANAGER_VERSION=v0.28.1
ALERTMANAGER_HOST=127.0.0.1
ALERTMANAGER_PORT="${ALERTMANAGER_PORT:-19095}"
BIN_DIR="${STATE_ROOT}/bin"
BINARY="${BIN_DIR}/alertmanager-${ALERTMANAGER_VERSION}"
STATE_DIR="${STATE_ROOT}/alertmanager"
CONFIG="${STATE_DIR}/alertmanager.yml"
PID_FILE="${STATE_DIR}/alertmanager.pid"
LOG_FILE="${STATE_DIR}/alertmanager.log"
TEMPLATE="${REPO_ROOT}/deploy/alertmanager/alertmanager.yml.in"

READY_TIMEOUT_S=30
STOP_TIMEOUT_S=10
# How long start/stop waits for another run of this script (take_lock, common.sh): a
# first build may take minutes.
LOCK_WAIT_S=300

usage() {
    printf 'usage: %s {build|start|stop|status}\n' "$0" >&2
    exit 2
}

cmd_build() {
    [[ -x "${BINARY}" ]] && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed; Alertmanager is built with it"
    local started tmp
    started="$(now)"
    tmp="$(mktemp -d)"
    log "building Alertmanager ${ALERTMANAGER_VERSION} from the Go module proxy (once) ..."
    GOBIN="${tmp}" go install \
        "github.com/prometheus/alertmanager/cmd/alertmanager@${ALERTMANAGER_VERSION}" \
        || { rm -rf "${tmp}"; die "go install of Alertmanager ${ALERTMANAGER_VERSION} failed"; }
    mkdir -p "${BIN_DIR}"
    # Moved into place whole, so a build cut short never leaves a binary that looks cached.
    mv "${tmp}/alertmanager" "${BINARY}"
    rm -rf "${tmp}"
    log "built ${BINARY} in $(elapsed_since "${started}") s"
}

render_config() {
    local receiver=""
    if [[ -n "${ALERTMANAGER_WEBHOOK_URL:-}" ]]; then
        receiver="    webhook_configs:
      - url: ${ALERTMANAGER_WEBHOOK_URL}
        send_resolved: true"
    fi
    mkdir -p "${STATE_DIR}"
    awk -v receiver="${receiver}" -v wait="${ALERTMANAGER_GROUP_WAIT:-30s}" \
        -v interval="${ALERTMANAGER_GROUP_INTERVAL:-5m}" '
        /^@WEBHOOK_RECEIVER@$/ { if (receiver != "") print receiver; next }
        { gsub(/@GROUP_WAIT@/, wait); gsub(/@GROUP_INTERVAL@/, interval); print }
    ' "${TEMPLATE}" > "${CONFIG}"
}

ready() {
    command -v curl >/dev/null 2>&1 || return 1
    curl -fsS -m 2 "http://${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT}/-/ready" >/dev/null 2>&1
}

live_pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local pid
    pid="$(<"${PID_FILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
    grep -q '^alertmanager' "/proc/${pid}/comm" 2>/dev/null || return 1
    printf '%s' "${pid}"
}

cmd_start() {
    local started pid
    started="$(now)"
    if pid="$(live_pid)" && ready; then
        log "already running (pid ${pid}) on ${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT}"
        return 0
    fi
    if ready; then
        die "${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT} is in use by a process this script did not start; stop it or set ALERTMANAGER_PORT"
    fi
    cmd_build
    render_config
    "${BINARY}" --config.file="${CONFIG}" --storage.path="${STATE_DIR}/data" \
        --web.listen-address="${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT}" \
        --cluster.listen-address="" >>"${LOG_FILE}" 2>&1 9>&- &
    echo $! >"${PID_FILE}"
    local deadline=$(( EPOCHSECONDS + READY_TIMEOUT_S ))
    until ready; do
        if ! kill -0 "$(<"${PID_FILE}")" 2>/dev/null || (( EPOCHSECONDS >= deadline )); then
            tail -n 40 "${LOG_FILE}" >&2 || true
            die "Alertmanager did not become ready on ${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT}"
        fi
        sleep 0.2
    done
    log "alertmanager ready on ${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT} (pid $(<"${PID_FILE}")) in $(elapsed_since "${started}") s"
}

cmd_stop() {
    local pid
    if ! pid="$(live_pid)"; then
        rm -f "${PID_FILE}"
        log "not running"
        return 0
    fi
    kill -TERM "${pid}" 2>/dev/null || true
    wait_exit "${pid}" "${STOP_TIMEOUT_S}" || kill_hard "${pid}" "ignored SIGTERM"
    rm -f "${PID_FILE}"
    log "stopped pid ${pid}"
}

cmd_status() {
    local pid
    if pid="$(live_pid)" && ready; then
        log "running (pid ${pid}) on ${ALERTMANAGER_HOST}:${ALERTMANAGER_PORT}"
        return 0
    fi
    log "not running"
    return 1
}


main() {
    [[ $# -eq 1 ]] || usage
    validate_port ALERTMANAGER_PORT "${ALERTMANAGER_PORT}"
    run_build_start_stop_status "$1"
}

main "$@"
