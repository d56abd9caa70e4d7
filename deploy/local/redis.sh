#!/usr/bin/env bash
# Runs a private redis-server for local development and integration tests.
#
#   deploy/local/redis.sh start    start (or confirm already running) and wait for PONG
#   deploy/local/redis.sh stop     SHUTDOWN via redis-cli, falling back to SIGTERM/SIGKILL
#   deploy/local/redis.sh status   exit 0 if it answers PING, 1 otherwise
#   deploy/local/redis.sh url U    (secured) print the URL that connects as user U
#
# Secured (docs/security.md, "Redis users"): `start --secure`, or REDIS_SECURITY=acl for every
# command, runs redis-server with the ACL file of services/shared/redis_access.py: the default
# user off, an admin, and one user per service confined to the keys of WARDEN_NAMESPACE and to
# commands outside @dangerous. Passwords are made once (owner-only) beside the file. Its state
# lives apart, in $WARDEN_STATE_DIR/redis-secure, so both servers can run side by side.
#
# Environment:
#   WARDEN_STATE_DIR   state root (default <repo>/.state); this script uses $WARDEN_STATE_DIR/redis
#   REDIS_PORT         default 16379, deliberately not 6379 so a system redis (which the Debian
#                      package may start on install) never collides with this one
set -euo pipefail

SECURE=0
case "${REDIS_SECURITY:-none}" in
    none) ;;
    acl) SECURE=1 ;;
    *) printf 'redis: error: REDIS_SECURITY is %s, not none or acl\n' "${REDIS_SECURITY}" >&2; exit 2 ;;
esac
if [[ "${2:-}" == "--secure" ]]; then
    SECURE=1
    set -- "$1" "${@:3}"
fi

if (( SECURE )); then COMPONENT=redis-secure; else COMPONENT=redis; fi
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

REDIS_HOST=127.0.0.1
REDIS_PORT="${REDIS_PORT:-16379}"
STATE_DIR="${STATE_ROOT}/${COMPONENT}"
ACL_DIR="${STATE_DIR}/acl"
PID_FILE="${STATE_DIR}/redis.pid"
LOG_FILE="${STATE_DIR}/redis.log"

READY_TIMEOUT_S=20
STOP_TIMEOUT_S=15
# How long start/stop waits for another run of this script (take_lock, common.sh).
LOCK_WAIT_S=$(( READY_TIMEOUT_S + STOP_TIMEOUT_S + 10 ))


usage() {
    printf 'usage: %s {start [--secure]|stop|status|url USER}\n' "$0" >&2
    exit 2
}

# Installs Debian's redis-server (which brings redis-cli) when either binary is missing.
ensure_redis() {
    if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
        return 0
    fi
    apt_install_or_die redis-server redis-server
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        die "apt-get finished but redis-server/redis-cli are still not on PATH"
    fi
}

# True if whatever listens on the port answers PING. `timeout` guards against a listener that
# accepts the connection but never replies (redis-cli itself would wait forever).
answers_ping() {
    command -v redis-cli >/dev/null 2>&1 || return 1
    [[ "$(timeout 2 redis-cli "${CLI[@]}" ping 2>/dev/null)" == "PONG" ]]
}

# redis-cli's arguments for our server; on the secured one, as its admin (set by set_cli once
# the password exists).
CLI=(-h "${REDIS_HOST}" -p "${REDIS_PORT}")
set_cli() {
    if (( SECURE )) && [[ -f "${ACL_DIR}/admin.password" ]]; then
        CLI=(-h "${REDIS_HOST}" -p "${REDIS_PORT}" --user admin
             --pass "$(<"${ACL_DIR}/admin.password")" --no-auth-warning)
    fi
}

# The secured server's users: passwords made once, the ACL file written at every start.
write_acl() {
    require_venv
    PYTHONPATH="${REPO_ROOT}" "${VENV_PY}" -m services.shared.redis_access write \
        --namespace "${WARDEN_NAMESPACE:-}" --dir "${ACL_DIR}" >/dev/null \
        || die "writing the ACL file failed"
    set_cli
}

cmd_url() {
    (( SECURE )) || die "url is for the secured server (start --secure or REDIS_SECURITY=acl)"
    require_venv
    PYTHONPATH="${REPO_ROOT}" "${VENV_PY}" -m services.shared.redis_access url "$1" \
        --dir "${ACL_DIR}" --host "${REDIS_HOST}" --port "${REDIS_PORT}"
}

port_open() {
    # shellcheck disable=SC2016  # $1/$2 are expanded by the inner bash, not this one
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "${REDIS_HOST}" "${REDIS_PORT}" 2>/dev/null
}

# Prints the pid from redis's own pid file if that process is alive and is a redis-server (pids
# are reused, so a bare `kill -0` could point at an unrelated process after a reboot).
live_pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local pid
    pid="$(<"${PID_FILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    kill -0 "${pid}" 2>/dev/null || return 1
    grep -q '^redis-server' "/proc/${pid}/comm" 2>/dev/null || return 1
    printf '%s' "${pid}"
}

cmd_start() {
    local started pid
    started="$(now)"
    if pid="$(live_pid)"; then
        if answers_ping; then
            log "already running (pid ${pid}) on ${REDIS_HOST}:${REDIS_PORT}"
            return 0
        fi
        # Ours but not answering yet: it replies -LOADING while replaying a large AOF.
        log "pid ${pid} is running but not answering PING yet; waiting for it"
        wait_until_ready "${started}"
        return 0
    fi
    # Someone else's server on our port would make the PING check pass against the wrong data.
    if port_open; then
        die "${REDIS_HOST}:${REDIS_PORT} is already in use by a process this script did not start; stop it or set REDIS_PORT"
    fi

    ensure_redis
    mkdir -p "${STATE_DIR}"
    # A stale pid file from a crashed run would otherwise be trusted by live_pid until redis
    # rewrites it.
    rm -f "${PID_FILE}"

    # AOF with fsync every second: survives a crash losing at most ~1 s of writes, and RDB
    # snapshots are off (--save "") so there is a single persistence path to reason about.
    # Bound to loopback with protected mode on: without --secure this is a dev instance with no
    # password. fd 9 (the lock) is closed for the daemon, or it would hold the lock for as long
    # as it runs.
    local acl=()
    if (( SECURE )); then
        write_acl
        acl=(--aclfile "${ACL_DIR}/users.acl")
    fi
    redis-server \
        --bind "${REDIS_HOST}" \
        --port "${REDIS_PORT}" \
        --protected-mode yes \
        --daemonize yes \
        --dir "${STATE_DIR}" \
        --pidfile "${PID_FILE}" \
        --logfile "${LOG_FILE}" \
        --appendonly yes \
        --appendfsync everysec \
        --save "" \
        "${acl[@]}" \
        9>&- \
        || { tail -n 40 "${LOG_FILE}" >&2 2>/dev/null || true; die "redis-server failed to start"; }

    wait_until_ready "${started}"
}

wait_until_ready() {
    local started="$1" pid
    local deadline=$(( EPOCHSECONDS + READY_TIMEOUT_S ))
    until answers_ping; do
        if (( EPOCHSECONDS >= deadline )); then
            if [[ -f "${LOG_FILE}" ]]; then
                printf -- '--- last 40 lines of %s ---\n' "${LOG_FILE}" >&2
                tail -n 40 "${LOG_FILE}" >&2
            fi
            die "no PONG from ${REDIS_HOST}:${REDIS_PORT} after ${READY_TIMEOUT_S} s"
        fi
        sleep 0.1
    done
    pid="$(live_pid)" || pid="?"
    log "redis ready on ${REDIS_HOST}:${REDIS_PORT} (pid ${pid}) in $(elapsed_since "${started}") s"
}

cmd_stop() {
    local pid=""
    pid="$(live_pid)" || pid=""
    if [[ -z "${pid}" ]] && ! answers_ping; then
        rm -f "${PID_FILE}"
        log "not running"
        return 0
    fi
    if [[ -z "${pid}" ]]; then
        # Something answers on our port but it is not the server from our pid file; it is not
        # ours to shut down.
        die "${REDIS_HOST}:${REDIS_PORT} answers PING but ${PID_FILE} does not name a live redis-server; not stopping it"
    fi
    # SHUTDOWN fsyncs the AOF before exiting. redis-cli reports the dropped connection as an
    # error even on success, so its exit status is not meaningful here.
    local rc=0
    timeout 10 redis-cli "${CLI[@]}" shutdown >/dev/null 2>&1 || rc=$?
    # 124 means redis-cli itself timed out: the server is wedged, so waiting for SHUTDOWN to
    # take effect would only waste STOP_TIMEOUT_S more; go straight to signals.
    if (( rc == 124 )) || ! wait_exit "${pid}" "${STOP_TIMEOUT_S}"; then
        log "SHUTDOWN did not stop pid ${pid}; sending SIGTERM"
        kill -TERM "${pid}" 2>/dev/null || true
        wait_exit "${pid}" 5 || kill_hard "${pid}" "ignored SIGTERM"
    fi
    rm -f "${PID_FILE}"
    log "stopped pid ${pid}"
}


cmd_status() {
    local pid
    if pid="$(live_pid)" && answers_ping; then
        log "running (pid ${pid}) on ${REDIS_HOST}:${REDIS_PORT}"
        return 0
    fi
    log "not running"
    return 1
}

main() {
    [[ $# -ge 1 ]] || usage
    validate_port REDIS_PORT "${REDIS_PORT}"
    set_cli
    case "$1" in
        start) [[ $# -eq 1 ]] || usage; take_lock "${LOCK_WAIT_S}"; cmd_start ;;
        stop) [[ $# -eq 1 ]] || usage; take_lock "${LOCK_WAIT_S}"; cmd_stop ;;
        status) [[ $# -eq 1 ]] || usage; cmd_status ;;
        url) [[ $# -eq 2 ]] || usage; cmd_url "$2" ;;
        *) usage ;;
    esac
}

main "$@"
