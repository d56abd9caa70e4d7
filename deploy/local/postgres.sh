#!/usr/bin/env bash
# Runs a private PostgreSQL server for the task store's tests and local development, from the
# Debian packages (/usr/lib/postgresql/<version>/bin). No Docker needed.
#
#   deploy/local/postgres.sh start    initdb on first use, start (or confirm already running),
#                                     wait until it accepts connections, create database "warden"
#   deploy/local/postgres.sh stop     fast shutdown (pg_ctl -m fast), then SIGQUIT, then SIGKILL
#   deploy/local/postgres.sh status   exit 0 if running and accepting connections, 1 otherwise
#
# Environment:
#   WARDEN_STATE_DIR   state root (default <repo>/.state); this script uses
#                      $WARDEN_STATE_DIR/postgres (data/, postgres.log)
#   POSTGRES_PORT      default 15432, deliberately not 5432 so the cluster the Debian package
#                      may create and start on install never collides with this one
#
# Connect as user postgres without a password (trust, on 127.0.0.1 only):
#   postgresql+asyncpg://postgres@127.0.0.1:${POSTGRES_PORT}/warden
# initdb and postgres refuse to run as root: run by root, this script runs them as the
# `postgres` system user (made by the Debian package) and gives it the state directory.
set -euo pipefail

COMPONENT=postgres
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

POSTGRES_HOST=127.0.0.1
POSTGRES_PORT="${POSTGRES_PORT:-15432}"
POSTGRES_DB=warden
POSTGRES_SUPERUSER=postgres
STATE_DIR="${STATE_ROOT}/postgres"
DATA_DIR="${STATE_DIR}/data"
LOG_FILE="${STATE_DIR}/postgres.log"
PID_FILE="${DATA_DIR}/postmaster.pid"
# Regenerated on every start (like kafka.sh's server.properties) so a changed port takes effect;
# postgresql.conf includes it.
WARDEN_CONF="${DATA_DIR}/warden.conf"
# The system user that owns the data directory when this script runs as root.
RUN_AS=postgres

READY_TIMEOUT_S=60
STOP_TIMEOUT_S=30
# How long start/stop waits for another run of this script (take_lock, common.sh).
LOCK_WAIT_S=$(( READY_TIMEOUT_S + STOP_TIMEOUT_S + 10 ))


usage() {
    printf 'usage: %s {start|stop|status}\n' "$0" >&2
    exit 2
}

# The newest installed server's bin directory (Debian keeps one per major version). Prints
# nothing when none is installed.
pg_bindir() {
    local dir
    dir="$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n 1 || true)"
    [[ -n "${dir}" ]] && printf '%s' "${dir%/postgres}"
}

# Installs Debian's postgresql (server and clients) when no server binary is there.
ensure_postgres() {
    if [[ -n "$(pg_bindir)" ]]; then
        return 0
    fi
    apt_install_or_die PostgreSQL postgresql
    [[ -n "$(pg_bindir)" ]] || die "apt-get finished but no /usr/lib/postgresql/*/bin/postgres exists"
}

# Runs a server binary as the data directory's owner: itself, or `postgres` when run by root.
as_owner() {
    if (( EUID == 0 )); then
        # runuser (util-linux) switches user without PAM prompts; HOME and the working
        # directory are root's otherwise, which postgres cannot read.
        (cd / && runuser -u "${RUN_AS}" -- env HOME="${STATE_DIR}" "$@")
    else
        "$@"
    fi
}

# As root: the postgres user must own the state directory and reach it through every parent.
prepare_owner() {
    (( EUID == 0 )) || return 0
    id -u "${RUN_AS}" >/dev/null 2>&1 \
        || die "running as root needs the '${RUN_AS}' system user (made by Debian's postgresql package) to run the server"
    chown -R "${RUN_AS}:" "${STATE_DIR}"
    # Fails with a clear message rather than an initdb "permission denied" deep in its output.
    runuser -u "${RUN_AS}" -- test -w "${STATE_DIR}" \
        || die "user ${RUN_AS} cannot reach ${STATE_DIR} (a parent directory is not searchable by others); set WARDEN_STATE_DIR to a directory it can reach"
}

# True if the server on our port accepts connections. pg_isready talks the protocol, so a
# foreign non-PostgreSQL listener does not pass; `timeout` bounds a listener that never answers.
answers() {
    local bindir
    bindir="$(pg_bindir)"
    [[ -n "${bindir}" ]] || return 1
    timeout 5 "${bindir}/pg_isready" -q -h "${POSTGRES_HOST}" -p "${POSTGRES_PORT}" -U "${POSTGRES_SUPERUSER}" \
        -d postgres 2>/dev/null
}

port_open() {
    # shellcheck disable=SC2016  # $1/$2 are expanded by the inner bash, not this one
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "${POSTGRES_HOST}" "${POSTGRES_PORT}" 2>/dev/null
}

# Prints the postmaster's pid from its own pid file if that process is alive and is a postgres
# (pids are reused, so a bare `kill -0` could point at an unrelated process after a reboot).
live_pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local pid
    pid="$(head -n 1 "${PID_FILE}" 2>/dev/null)" || return 1
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    kill -0 "${pid}" 2>/dev/null || return 1
    grep -q '^postgres' "/proc/${pid}/comm" 2>/dev/null || return 1
    # The postmaster is reparented to PID 1 (pg_ctl detaches it); until that reaps it, an
    # exited postmaster is a zombie that `kill -0` still finds. Its state letter is Z.
    local stat
    stat="$(<"/proc/${pid}/stat")" 2>/dev/null || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != "Z" ]] || return 1
    printf '%s' "${pid}"
}

# Waits up to $1 seconds for the postmaster to be gone (zombie-aware, unlike wait_exit).
wait_gone() {
    local i
    for (( i = 0; i < $1 * 10; i++ )); do
        live_pid >/dev/null || return 0
        sleep 0.1
    done
    ! live_pid >/dev/null
}

show_log_tail() {
    if [[ -s "${LOG_FILE}" ]]; then
        printf -- '--- last 40 lines of %s ---\n' "${LOG_FILE}" >&2
        tail -n 40 "${LOG_FILE}" >&2
    fi
}

init_cluster() {
    # PG_VERSION exists once initdb has finished; a half-made directory from an interrupted
    # initdb has none and is made again.
    [[ -f "${DATA_DIR}/PG_VERSION" ]] && return 0
    rm -rf "${DATA_DIR}"
    log "initdb into ${DATA_DIR} ..."
    # Trust authentication, and the server listens on 127.0.0.1 only (warden.conf): a dev and
    # test instance without a password, unreachable from other machines. The C locale keeps
    # sorting identical on every machine; --no-sync saves seconds on a throwaway cluster.
    as_owner "$(pg_bindir)/initdb" -D "${DATA_DIR}" -U "${POSTGRES_SUPERUSER}" \
        --auth=trust --encoding=UTF8 --locale=C --no-sync >>"${LOG_FILE}" 2>&1 \
        || { show_log_tail; die "initdb failed"; }
    printf "\n# Added by deploy/local/postgres.sh: settings it regenerates on every start.\ninclude_if_exists = 'warden.conf'\n" \
        >>"${DATA_DIR}/postgresql.conf"
}

write_config() {
    cat >"${WARDEN_CONF}" <<EOF
# Generated by deploy/local/postgres.sh on every start; edit the script, not this file.
listen_addresses = '${POSTGRES_HOST}'
port = ${POSTGRES_PORT}
# TCP only: a socket directory would need a short path that every state root cannot give.
unix_socket_directories = ''
# A commit may lose its last few hundred milliseconds in a crash, never consistency (as
# redis.sh's appendfsync everysec): tests make and drop a database each and commit often.
synchronous_commit = off
EOF
    if (( EUID == 0 )); then chown "${RUN_AS}:" "${WARDEN_CONF}"; fi
}

ensure_database() {
    local exists
    exists="$("$(pg_bindir)/psql" -X -q -t -A -h "${POSTGRES_HOST}" -p "${POSTGRES_PORT}" -U "${POSTGRES_SUPERUSER}" \
        -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '${POSTGRES_DB}'")" \
        || die "could not query the server on ${POSTGRES_HOST}:${POSTGRES_PORT}"
    [[ "${exists}" == "1" ]] && return 0
    "$(pg_bindir)/psql" -X -q -h "${POSTGRES_HOST}" -p "${POSTGRES_PORT}" -U "${POSTGRES_SUPERUSER}" -d postgres \
        -c "CREATE DATABASE ${POSTGRES_DB}" >/dev/null \
        || die "could not create database ${POSTGRES_DB}"
    log "created database ${POSTGRES_DB}"
}

wait_until_ready() {
    local started="$1" pid
    local deadline=$(( EPOCHSECONDS + READY_TIMEOUT_S ))
    until answers; do
        if ! live_pid >/dev/null; then
            show_log_tail
            die "the server exited during start-up"
        fi
        if (( EPOCHSECONDS >= deadline )); then
            show_log_tail
            die "not accepting connections on ${POSTGRES_HOST}:${POSTGRES_PORT} after ${READY_TIMEOUT_S} s"
        fi
        sleep 0.1
    done
    ensure_database
    pid="$(live_pid)" || pid="?"
    log "postgres ready on ${POSTGRES_HOST}:${POSTGRES_PORT} (pid ${pid}) in $(elapsed_since "${started}") s"
}

cmd_start() {
    local started pid
    started="$(now)"
    if pid="$(live_pid)"; then
        if answers; then
            ensure_database
            log "already running (pid ${pid}) on ${POSTGRES_HOST}:${POSTGRES_PORT}"
            return 0
        fi
        # Ours but not answering yet: still replaying WAL after a crash, or a start that was
        # interrupted. Wait for it rather than start a second one.
        log "pid ${pid} is running but not accepting connections yet; waiting for it"
        wait_until_ready "${started}"
        return 0
    fi
    # Someone else's server on our port would make the readiness check pass against the wrong
    # data.
    if port_open; then
        die "${POSTGRES_HOST}:${POSTGRES_PORT} is already in use by a process this script did not start; stop it or set POSTGRES_PORT"
    fi

    ensure_postgres
    mkdir -p "${STATE_DIR}"
    # Made before prepare_owner so the server (pg_ctl -l) may append to what initdb wrote.
    touch "${LOG_FILE}"
    prepare_owner
    init_cluster
    write_config

    # pg_ctl detaches the postmaster (it outlives this shell), removes a stale pid file of a
    # crashed run itself, and with -w waits until the server says it is ready (or has died).
    # fd 9 (the lock) is closed for the server, or it would hold the lock for as long as it runs.
    log "starting on ${POSTGRES_HOST}:${POSTGRES_PORT}; waiting up to ${READY_TIMEOUT_S} s ..."
    as_owner "$(pg_bindir)/pg_ctl" -D "${DATA_DIR}" -l "${LOG_FILE}" -w -t "${READY_TIMEOUT_S}" \
        start >/dev/null 9>&- || { show_log_tail; die "pg_ctl start failed"; }
    wait_until_ready "${started}"
}

cmd_stop() {
    local pid started
    if ! pid="$(live_pid)"; then
        log "not running"
        return 0
    fi
    started="$(now)"
    # Fast shutdown: open sessions are rolled back and disconnected, then a checkpoint is
    # written, which spares the next start a recovery pass. pg_ctl -w returns once the
    # postmaster has removed its pid file, i.e. has finished.
    if ! as_owner "$(pg_bindir)/pg_ctl" -D "${DATA_DIR}" -m fast -w -t "${STOP_TIMEOUT_S}" stop \
        >/dev/null 2>&1 && ! wait_gone 1; then
        # Immediate shutdown: no checkpoint; the next start recovers from the WAL.
        log "pg_ctl did not stop pid ${pid} in ${STOP_TIMEOUT_S} s; sending SIGQUIT"
        kill -QUIT "${pid}" 2>/dev/null || true
        if ! wait_gone 5; then
            log "pid ${pid} ignored SIGQUIT; sending SIGKILL"
            kill -KILL "${pid}" 2>/dev/null || true
            wait_gone 10 || die "pid ${pid} is still alive after SIGKILL"
        fi
    fi
    log "stopped pid ${pid} in $(elapsed_since "${started}") s"
}

cmd_status() {
    local pid
    if pid="$(live_pid)" && answers; then
        log "running (pid ${pid}) on ${POSTGRES_HOST}:${POSTGRES_PORT}"
        return 0
    fi
    if [[ -n "${pid:-}" ]]; then
        log "pid ${pid} is alive but ${POSTGRES_HOST}:${POSTGRES_PORT} is not accepting connections"
    else
        log "not running"
    fi
    return 1
}


main() {
    [[ $# -eq 1 ]] || usage
    validate_port POSTGRES_PORT "${POSTGRES_PORT}"
    case "$1" in
        start) take_lock "${LOCK_WAIT_S}"; cmd_start ;;
        stop) take_lock "${LOCK_WAIT_S}"; cmd_stop ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

main "$@"
