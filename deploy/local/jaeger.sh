#!/usr/bin/env bash
# Runs Jaeger (v2: traces in over OTLP, kept in memory, the query API out) for local
# development and the integration tests. The program is built once from the Go module proxy
# (cached under the state folder); its config is deploy/jaeger/config.yaml, which reads the
# addresses below from the environment.
#
#   deploy/local/jaeger.sh build    build the binary if it is not cached yet
#   deploy/local/jaeger.sh start    build if needed, start (or confirm running), wait ready
#   deploy/local/jaeger.sh stop     SIGTERM, then SIGKILL
#   deploy/local/jaeger.sh status   exit 0 if the query API answers, 1 otherwise
#
# Point the services at it with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14317 and query
# http://127.0.0.1:16686/api/traces, or browse it from Grafana's Jaeger data source: built from
# the module's source it serves no web UI of its own (docs/tracing.md).
#
# Environment:
#   WARDEN_STATE_DIR         state root (default <repo>/.state); the binary is
#                            bin/jaeger-<version>/jaeger, the log and pid in jaeger/
#   JAEGER_OTLP_GRPC_PORT    OTLP over gRPC, default 14317 (not 4317, so a system collector
#                            never collides)
#   JAEGER_OTLP_HTTP_PORT    OTLP over HTTP, default 14318
#   JAEGER_UI_PORT           the query API (/api/traces), default 16686
#   JAEGER_QUERY_GRPC_PORT   the query API over gRPC, default 16685
#   JAEGER_MAX_TRACES        traces kept in memory, oldest dropped first; default 20000
set -euo pipefail

COMPONENT=jaeger
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# v1.75.0, the module version of the Jaeger v2 release built with it (cmd/jaeger), built and
# run on Go 1.26. Its go.mod has a replace directive, which `go install module@version`
# refuses: it is built from the module's source instead (go_build_module_into).
JAEGER_VERSION=v1.75.0
JAEGER_MODULE="github.com/jaegertracing/jaeger@${JAEGER_VERSION}"
JAEGER_LDFLAGS="-X github.com/jaegertracing/jaeger/internal/version.latestVersion=${JAEGER_VERSION}"
JAEGER_HOST=127.0.0.1
JAEGER_OTLP_GRPC_PORT="${JAEGER_OTLP_GRPC_PORT:-14317}"
JAEGER_OTLP_HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-14318}"
JAEGER_UI_PORT="${JAEGER_UI_PORT:-16686}"
JAEGER_QUERY_GRPC_PORT="${JAEGER_QUERY_GRPC_PORT:-16685}"
BIN_DIR="${STATE_ROOT}/bin/jaeger-${JAEGER_VERSION}"
BINARY="${BIN_DIR}/jaeger"
STATE_DIR="${STATE_ROOT}/jaeger"
CONFIG="${REPO_ROOT}/deploy/jaeger/config.yaml"
PID_FILE="${STATE_DIR}/jaeger.pid"
LOG_FILE="${STATE_DIR}/jaeger.log"

READY_TIMEOUT_S=30
STOP_TIMEOUT_S=10
# How long build, start and stop wait for another run of this script (take_lock, common.sh):
# a first build compiles a whole OpenTelemetry Collector, 10 minutes or more on 2 cores.
LOCK_WAIT_S=1800

usage() {
    printf 'usage: %s {build|start|stop|status}\n' "$0" >&2
    exit 2
}

cmd_build() {
    [[ -x "${BINARY}" ]] && return 0
    local started
    started="$(now)"
    log "building Jaeger ${JAEGER_VERSION} from the Go module proxy (once; many minutes) ..."
    go_build_module_into "${BIN_DIR}" "${JAEGER_MODULE}" ./cmd/jaeger jaeger \
        -ldflags "${JAEGER_LDFLAGS}"
    log "built ${BINARY} in $(elapsed_since "${started}") s"
}

# Ready when the query API answers and the OTLP receiver listens (the collector starts its
# extensions, the query API among them, before its receivers).
ready() {
    command -v curl >/dev/null 2>&1 || return 1
    curl -fsS -m 2 "http://${JAEGER_HOST}:${JAEGER_UI_PORT}/api/services" >/dev/null 2>&1 \
        || return 1
    # Any HTTP answer (a GET is refused with 405) shows the OTLP receiver is up.
    [[ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' \
        "http://${JAEGER_HOST}:${JAEGER_OTLP_HTTP_PORT}/v1/traces" 2>/dev/null)" != 000 ]]
}

live_pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local pid
    pid="$(<"${PID_FILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
    grep -q '^jaeger' "/proc/${pid}/comm" 2>/dev/null || return 1
    printf '%s' "${pid}"
}

cmd_start() {
    local started pid port
    started="$(now)"
    if pid="$(live_pid)" && ready; then
        log "already running (pid ${pid}); OTLP on ${JAEGER_HOST}:${JAEGER_OTLP_GRPC_PORT}, query API on http://${JAEGER_HOST}:${JAEGER_UI_PORT}"
        return 0
    fi
    for port in "${JAEGER_OTLP_GRPC_PORT}" "${JAEGER_OTLP_HTTP_PORT}" "${JAEGER_UI_PORT}" \
                "${JAEGER_QUERY_GRPC_PORT}"; do
        if (exec 3<>"/dev/tcp/${JAEGER_HOST}/${port}") 2>/dev/null; then
            die "${JAEGER_HOST}:${port} is in use by a process this script did not start; stop it or set the JAEGER_*_PORT variables"
        fi
    done
    cmd_build
    mkdir -p "${STATE_DIR}"
    JAEGER_OTLP_GRPC_ENDPOINT="${JAEGER_HOST}:${JAEGER_OTLP_GRPC_PORT}" \
    JAEGER_OTLP_HTTP_ENDPOINT="${JAEGER_HOST}:${JAEGER_OTLP_HTTP_PORT}" \
    JAEGER_QUERY_HTTP_ENDPOINT="${JAEGER_HOST}:${JAEGER_UI_PORT}" \
    JAEGER_QUERY_GRPC_ENDPOINT="${JAEGER_HOST}:${JAEGER_QUERY_GRPC_PORT}" \
    JAEGER_MAX_TRACES="${JAEGER_MAX_TRACES:-20000}" \
        "${BINARY}" --config "${CONFIG}" >>"${LOG_FILE}" 2>&1 9>&- &
    echo $! >"${PID_FILE}"
    local deadline=$(( EPOCHSECONDS + READY_TIMEOUT_S ))
    until ready; do
        if ! kill -0 "$(<"${PID_FILE}")" 2>/dev/null || (( EPOCHSECONDS >= deadline )); then
            tail -n 40 "${LOG_FILE}" >&2 || true
            die "Jaeger did not become ready on ${JAEGER_HOST}:${JAEGER_UI_PORT}"
        fi
        sleep 0.2
    done
    log "jaeger ready: OTLP on ${JAEGER_HOST}:${JAEGER_OTLP_GRPC_PORT} (gRPC) and ${JAEGER_OTLP_HTTP_PORT} (HTTP), query API on http://${JAEGER_HOST}:${JAEGER_UI_PORT} (pid $(<"${PID_FILE}")) in $(elapsed_since "${started}") s"
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
        log "running (pid ${pid}); query API on http://${JAEGER_HOST}:${JAEGER_UI_PORT}"
        return 0
    fi
    log "not running"
    return 1
}


main() {
    [[ $# -eq 1 ]] || usage
    local name
    for name in JAEGER_OTLP_GRPC_PORT JAEGER_OTLP_HTTP_PORT JAEGER_UI_PORT \
                JAEGER_QUERY_GRPC_PORT; do
        validate_port "${name}" "${!name}"
    done
    run_build_start_stop_status "$1"
}

main "$@"
