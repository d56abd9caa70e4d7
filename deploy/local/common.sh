# shellcheck shell=bash
# Shared by the local service scripts (sourced, not run): the state root, logging, timing,
# port checks, and starting Kafka, Redis, PostgreSQL, Alertmanager and Kubernetes for a command
# that needs them.
# The sourcing script sets COMPONENT (the prefix of its log lines) first.

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/../.." && pwd)"

STATE_ROOT="${WARDEN_STATE_DIR:-${REPO_ROOT}/.state}"
# Made absolute: the paths end up in generated config and in a daemon that may resolve them
# against a different working directory than the caller's.
mkdir -p "${STATE_ROOT}"
STATE_ROOT="$(cd "${STATE_ROOT}" && pwd)"

log() { printf '%s: %s\n' "${COMPONENT}" "$*"; }
die() { printf '%s: error: %s\n' "${COMPONENT}" "$*" >&2; exit 1; }

# Seconds since the epoch with microseconds; bash 5 provides it without forking `date`.
now() { printf '%s' "${EPOCHREALTIME}"; }

elapsed_since() {
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'
}

validate_port() {
    local name="$1" value="$2"
    if [[ ! "${value}" =~ ^[1-9][0-9]{0,4}$ ]] || (( value > 65535 )); then
        die "${name}=${value} is not a valid TCP port"
    fi
}

# Waits up to $2 seconds for pid $1 to exit; status 0 if it did.
wait_exit() {
    local pid="$1" i
    for (( i = 0; i < $2 * 10; i++ )); do
        kill -0 "${pid}" 2>/dev/null || return 0
        sleep 0.1
    done
    ! kill -0 "${pid}" 2>/dev/null
}

# The last resort of a stop: SIGKILL pid $1 (saying why, $2) and wait until it is gone.
kill_hard() {
    local pid="$1"
    kill -0 "${pid}" 2>/dev/null || return 0
    log "pid ${pid} $2; sending SIGKILL"
    kill -KILL "${pid}" 2>/dev/null || true
    while kill -0 "${pid}" 2>/dev/null; do sleep 0.1; done
}

# Builds a Go program with `go install <package>@<version>` from the module proxy into the
# folder $1, made in a temporary folder and moved into place whole, so a build cut short
# never leaves a binary that looks cached.
# Usage: go_install_into <final folder> <package@version> [go install flag...]
go_install_into() {
    local final="$1" package="$2" tmp
    shift 2
    command -v go >/dev/null 2>&1 || die "go is not installed; ${package} is built with it"
    tmp="$(mktemp -d)"
    chmod 755 "${tmp}"
    GOBIN="${tmp}" go install "$@" "${package}" \
        || { rm -rf "${tmp}"; die "go install of ${package} failed"; }
    mkdir -p "$(dirname "${final}")"
    rm -rf "${final}"
    mv "${tmp}" "${final}"
}

# Builds one program of a Go module at a released version into the folder $1, for a module
# whose go.mod has replace directives (`go install module@version` refuses those): the
# module's source comes from the module proxy into the module cache, and is built there as
# the main module, its go.sum checking every dependency. Made in a temporary folder and moved
# into place whole, as go_install_into does.
# Usage: go_build_module_into <final folder> <module@version> <./package> <binary name>
#        [go build flag...]
go_build_module_into() {
    local final="$1" module="$2" package="$3" binary="$4" tmp source
    shift 4
    command -v go >/dev/null 2>&1 || die "go is not installed; ${module} is built with it"
    # From the root folder: a go.mod in the caller's folder must not take part.
    source="$(cd / && go mod download -json "${module}" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" || source=""
    [[ -n "${source}" && -d "${source}" ]] \
        || die "go mod download of ${module} failed (no network or module proxy?)"
    tmp="$(mktemp -d)"
    chmod 755 "${tmp}"
    (cd "${source}" && go build -o "${tmp}/${binary}" "$@" "${package}") \
        || { rm -rf "${tmp}"; die "go build of ${module} ${package} failed"; }
    mkdir -p "$(dirname "${final}")"
    rm -rf "${final}"
    mv "${tmp}" "${final}"
}

# Serialises a script's start/stop: two concurrent `start`s would both find the port free and
# race to bind it. The lock, `$STATE_DIR/$COMPONENT.sh.lock`, is held on fd 9 until the script
# exits (each daemon is started with fd 9 closed, or it would hold the lock while it runs).
# Usage: take_lock <seconds to wait for it>
take_lock() {
    command -v flock >/dev/null 2>&1 || return 0
    mkdir -p "${STATE_DIR}"
    exec 9>"${STATE_DIR}/${COMPONENT}.sh.lock"
    flock -w "$1" 9 || die "another ${COMPONENT}.sh is still holding ${STATE_DIR}/${COMPONENT}.sh.lock"
}

# The commands of a script that builds its server: build, start and stop under the lock
# (take_lock), status without it. The script defines cmd_build, cmd_start, cmd_stop,
# cmd_status, usage and LOCK_WAIT_S. Usage: run_build_start_stop_status <command>
run_build_start_stop_status() {
    case "$1" in
        build) take_lock "${LOCK_WAIT_S}"; cmd_build ;;
        start) take_lock "${LOCK_WAIT_S}"; cmd_start ;;
        stop) take_lock "${LOCK_WAIT_S}"; cmd_stop ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

# Installs Debian packages with apt-get (root, or passwordless sudo), or stops with the command
# a person should run. The package index in a fresh container is usually empty, hence
# `apt-get update` first. Usage: apt_install_or_die <what, for messages> <package>...
apt_install_or_die() {
    local what="$1"
    shift
    command -v apt-get >/dev/null 2>&1 \
        || die "${what} not found and apt-get is unavailable; install $* by other means"
    local -a sudo=()
    if (( EUID != 0 )); then
        # -n: never prompt for a password from a script; fail and explain instead.
        if ! command -v sudo >/dev/null 2>&1 || ! sudo -n true 2>/dev/null; then
            die "${what} is not installed and installing it needs root; run: sudo apt-get update && sudo apt-get install -y $*"
        fi
        sudo=(sudo -n)
    fi
    log "${what} not found; installing $* with apt-get ..."
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
        || ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; then
        die "apt-get could not install $* (no network or package mirror?); install it manually: apt-get update && apt-get install -y $*"
    fi
}

# Starts Kafka, Redis, PostgreSQL (the task store's tests run against it as well as SQLite),
# Alertmanager and the Kubernetes control plane (the Kubernetes backend's tests) where they are
# not running, and stops (on exit) only what it started, so a developer's
# long-running broker survives `make test`.
LOCAL_SERVICES_STARTED=()
stop_started_services() {
    local svc
    for svc in "${LOCAL_SERVICES_STARTED[@]}"; do
        "${SCRIPT_DIR}/${svc}.sh" stop || true
    done
}
start_missing_services() {
    trap stop_started_services EXIT
    local svc
    for svc in kafka redis postgres alertmanager kubernetes; do
        if ! "${SCRIPT_DIR}/${svc}.sh" status >/dev/null 2>&1; then
            "${SCRIPT_DIR}/${svc}.sh" start
            LOCAL_SERVICES_STARTED+=("${svc}")
        fi
    done
}

# The project's Python, for the setup steps written in it (the secured broker's and Redis').
VENV_PY="${REPO_ROOT}/.venv/bin/python"

require_venv() {
    [[ -x "${VENV_PY}" ]] || die "${VENV_PY} is missing; the secured setup needs it: run make setup"
}
