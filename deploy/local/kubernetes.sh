#!/usr/bin/env bash
# Runs a real Kubernetes control plane for local development and the tests: etcd,
# kube-apiserver (token authentication, RBAC), kube-controller-manager, kube-scheduler, and
# kwok playing the kubelets of fake nodes. The programs are built once from the Go module proxy
# (deploy/local/kubernetes/, cached under the state folder by version).
#
#   deploy/local/kubernetes.sh build    build the binaries if they are not cached yet
#   deploy/local/kubernetes.sh start    build if needed, start (or confirm running), wait ready
#   deploy/local/kubernetes.sh stop     SIGTERM each process, then SIGKILL
#   deploy/local/kubernetes.sh status   exit 0 if every process runs and /readyz answers
#
# Environment:
#   WARDEN_STATE_DIR      state root (default <repo>/.state); binaries in bin/, the control
#                         plane's files in kubernetes/ (the admin kubeconfig is
#                         kubernetes/admin.kubeconfig)
#   KUBE_APISERVER_PORT   default 16443 (not 6443, so a real cluster's API server never collides)
#   KUBE_ETCD_PORT, KUBE_ETCD_PEER_PORT   default 12379 and 12380 (not etcd's 2379/2380)
set -euo pipefail

COMPONENT=kubernetes
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# The versions built and run together on Go 1.26 from the module proxy.
K8S_VERSION=v1.34.2
ETCD_VERSION=v3.6.5
KWOK_VERSION=v0.7.0
HOST=127.0.0.1
KUBE_APISERVER_PORT="${KUBE_APISERVER_PORT:-16443}"
KUBE_ETCD_PORT="${KUBE_ETCD_PORT:-12379}"
KUBE_ETCD_PEER_PORT="${KUBE_ETCD_PEER_PORT:-12380}"
BIN_DIR="${STATE_ROOT}/bin"
K8S_BIN="${BIN_DIR}/kubernetes-${K8S_VERSION}"
ETCD_BIN="${BIN_DIR}/etcd-${ETCD_VERSION}"
KWOK_BIN="${BIN_DIR}/kwok-${KWOK_VERSION}"
SOURCES="${REPO_ROOT}/deploy/local/kubernetes"
STATE_DIR="${STATE_ROOT}/kubernetes"
KUBECONFIG_FILE="${STATE_DIR}/admin.kubeconfig"
TOKEN_FILE="${STATE_DIR}/tokens.csv"
# Started in this order, stopped in the reverse one.
PROCESSES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

READY_TIMEOUT_S=60
STOP_TIMEOUT_S=15
# How long start/stop waits for another run of this script (take_lock, common.sh): a
# first build takes minutes.
LOCK_WAIT_S=900

usage() {
    printf 'usage: %s {build|start|stop|status}\n' "$0" >&2
    exit 2
}

# Builds into a temporary folder moved into place whole, so a build cut short never leaves
# binaries that look cached. Usage: build_into <final folder> <module folder> <package>...
build_into() {
    local final="$1" module="$2" tmp
    shift 2
    tmp="$(mktemp -d)"
    chmod 755 "${tmp}"
    (cd "${module}" && go build -o "${tmp}/" "$@") \
        || { rm -rf "${tmp}"; die "go build in ${module} failed"; }
    mkdir -p "${BIN_DIR}"
    rm -rf "${final}"
    mv "${tmp}" "${final}"
}

# What Kubernetes' release build stamps in with the linker (hack/lib/version.sh): without it
# the components report v0.0.0-master, which no chart's kubeVersion constraint admits and no
# client's version check understands. The stamp file says a cached build has it.
K8S_STAMP="${K8S_BIN}/VERSION"
k8s_ldflags() {
    local minor="${K8S_VERSION#v*.}" flags="" pkg
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
        flags+=" -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
    done
    printf '%s' "${flags# }"
}

k8s_built() {
    [[ -x "${K8S_BIN}/kube-apiserver" && "$(cat "${K8S_STAMP}" 2>/dev/null)" == "${K8S_VERSION}" ]]
}

cmd_build() {
    k8s_built && [[ -x "${ETCD_BIN}/etcd" && -x "${KWOK_BIN}/kwok" ]] && return 0
    command -v go >/dev/null 2>&1 || die "go is not installed; the control plane is built with it"
    local started
    started="$(now)"
    log "building Kubernetes ${K8S_VERSION}, etcd ${ETCD_VERSION} and kwok ${KWOK_VERSION} from the Go module proxy (once; minutes) ..."
    [[ -x "${ETCD_BIN}/etcd" ]] || build_into "${ETCD_BIN}" "${SOURCES}/etcd" .
    if ! k8s_built; then
        build_into "${K8S_BIN}" "${SOURCES}/k8s" -ldflags "$(k8s_ldflags)" ./cmd/...
        printf '%s\n' "${K8S_VERSION}" >"${K8S_STAMP}"
    fi
    [[ -x "${KWOK_BIN}/kwok" ]] \
        || go_install_into "${KWOK_BIN}" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
    log "built ${K8S_BIN}, ${ETCD_BIN} and ${KWOK_BIN} in $(elapsed_since "${started}") s"
}

# The admin token, the service-account signing key and the kubeconfig: made once per state
# folder, so a restart keeps every client's credentials valid.
write_credentials() {
    mkdir -p "${STATE_DIR}/certs"
    if [[ ! -s "${TOKEN_FILE}" ]]; then
        local token
        token="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
        (umask 077 && printf '%s,clusterwarden-admin,clusterwarden-admin,system:masters\n' \
            "${token}" >"${TOKEN_FILE}")
    fi
    if [[ ! -s "${STATE_DIR}/sa.key" ]]; then
        (umask 077 && openssl genrsa -out "${STATE_DIR}/sa.key" 2048 2>/dev/null)
        openssl rsa -in "${STATE_DIR}/sa.key" -pubout -out "${STATE_DIR}/sa.pub" 2>/dev/null
    fi
}

write_kubeconfig() {
    local token
    token="$(cut -d, -f1 "${TOKEN_FILE}")"
    (umask 077 && cat >"${KUBECONFIG_FILE}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: clusterwarden-local
  cluster:
    server: https://${HOST}:${KUBE_APISERVER_PORT}
    certificate-authority: ${STATE_DIR}/certs/apiserver.crt
users:
- name: clusterwarden-admin
  user:
    token: ${token}
contexts:
- name: clusterwarden-local
  context:
    cluster: clusterwarden-local
    user: clusterwarden-admin
current-context: clusterwarden-local
EOF
    )
}

etcd_ready() {
    curl -fsS -m 2 "http://${HOST}:${KUBE_ETCD_PORT}/health" >/dev/null 2>&1
}

# GET of an API path $1 as the admin; status 0 if it answers 2xx.
api_get() {
    [[ -s "${TOKEN_FILE}" ]] || return 1
    curl -fsS -m 2 -k -H "Authorization: Bearer $(cut -d, -f1 "${TOKEN_FILE}")" \
        "https://${HOST}:${KUBE_APISERVER_PORT}$1" >/dev/null 2>&1
}

apiserver_ready() { api_get /readyz; }

port_open() {
    # shellcheck disable=SC2016  # $1/$2 are expanded by the inner bash, not this one
    timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "${HOST}" "$1" 2>/dev/null
}

pid_file() { printf '%s/%s.pid' "${STATE_DIR}" "$1"; }

# The pid of process $1 if it is alive and is that program (pids are reused).
live_pid() {
    local file pid
    file="$(pid_file "$1")"
    [[ -f "${file}" ]] || return 1
    pid="$(<"${file}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
    # /proc/PID/comm is cut at 15 characters: kube-controller-manager shows as kube-controller.
    grep -q "^${1:0:15}" "/proc/${pid}/comm" 2>/dev/null || return 1
    printf '%s' "${pid}"
}

# The command line of process $1.
command_of() {
    local kubeconfig="${KUBECONFIG_FILE}"
    case "$1" in
        etcd) printf '%s\0' "${ETCD_BIN}/etcd" --name=clusterwarden \
            --data-dir="${STATE_DIR}/etcd" \
            --listen-client-urls="http://${HOST}:${KUBE_ETCD_PORT}" \
            --advertise-client-urls="http://${HOST}:${KUBE_ETCD_PORT}" \
            --listen-peer-urls="http://${HOST}:${KUBE_ETCD_PEER_PORT}" \
            --initial-advertise-peer-urls="http://${HOST}:${KUBE_ETCD_PEER_PORT}" \
            --initial-cluster="clusterwarden=http://${HOST}:${KUBE_ETCD_PEER_PORT}" \
            --listen-metrics-urls="" ;;
        kube-apiserver) printf '%s\0' "${K8S_BIN}/kube-apiserver" \
            --etcd-servers="http://${HOST}:${KUBE_ETCD_PORT}" \
            --secure-port="${KUBE_APISERVER_PORT}" --bind-address="${HOST}" \
            --advertise-address="${HOST}" --cert-dir="${STATE_DIR}/certs" \
            --token-auth-file="${TOKEN_FILE}" --authorization-mode=Node,RBAC \
            --service-account-issuer=https://kubernetes.default.svc \
            --service-account-key-file="${STATE_DIR}/sa.pub" \
            --service-account-signing-key-file="${STATE_DIR}/sa.key" \
            --service-cluster-ip-range=10.96.0.0/12 ;;
        kube-controller-manager) printf '%s\0' "${K8S_BIN}/kube-controller-manager" \
            --kubeconfig="${kubeconfig}" --authentication-kubeconfig="${kubeconfig}" \
            --authorization-kubeconfig="${kubeconfig}" \
            --service-account-private-key-file="${STATE_DIR}/sa.key" \
            --root-ca-file="${STATE_DIR}/certs/apiserver.crt" \
            --controllers='*,-nodeipam,-cloud-node-lifecycle' \
            --secure-port=0 --leader-elect=false ;;
        kube-scheduler) printf '%s\0' "${K8S_BIN}/kube-scheduler" \
            --kubeconfig="${kubeconfig}" --authentication-kubeconfig="${kubeconfig}" \
            --authorization-kubeconfig="${kubeconfig}" --secure-port=0 --leader-elect=false ;;
        kwok) printf '%s\0' "${KWOK_BIN}/kwok" --kubeconfig="${kubeconfig}" \
            --manage-all-nodes=false \
            --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
            --manage-nodes-with-label-selector= --manage-single-node= \
            --cidr=10.0.0.1/24 --node-ip=10.0.0.1 ;;
    esac
}

# Starts process $1 in the background with the lock's fd closed (or it would hold the lock).
spawn() {
    local -a argv
    mapfile -d '' argv < <(command_of "$1")
    "${argv[@]}" >>"${STATE_DIR}/$1.log" 2>&1 9>&- &
    echo $! >"$(pid_file "$1")"
}

# Waits for the check (the command $2...) after starting process $1; the log's tail and a
# stop of everything if it never passes.
await() {
    local deadline=$(( EPOCHSECONDS + READY_TIMEOUT_S ))
    until "${@:2}"; do
        if ! live_pid "$1" >/dev/null || (( EPOCHSECONDS >= deadline )); then
            tail -n 30 "${STATE_DIR}/$1.log" >&2 || true
            cmd_stop
            die "$1 did not become ready"
        fi
        sleep 0.2
    done
}

alive() { live_pid "$1" >/dev/null; }

# Ready once the controller-manager made the default namespace's service account: until then
# the API server refuses pods there.
workloads_accepted() { api_get /api/v1/namespaces/default/serviceaccounts/default; }

cmd_start() {
    local started proc
    started="$(now)"
    if cmd_status >/dev/null 2>&1; then
        log "already running on https://${HOST}:${KUBE_APISERVER_PORT} (kubeconfig ${KUBECONFIG_FILE})"
        return 0
    fi
    # A half-running control plane of ours is stopped and started whole.
    cmd_stop >/dev/null
    local port
    for port in "${KUBE_APISERVER_PORT}" "${KUBE_ETCD_PORT}" "${KUBE_ETCD_PEER_PORT}"; do
        if port_open "${port}"; then
            die "${HOST}:${port} is in use by a process this script did not start; stop it or set KUBE_APISERVER_PORT/KUBE_ETCD_PORT/KUBE_ETCD_PEER_PORT"
        fi
    done
    cmd_build
    write_credentials
    write_kubeconfig
    spawn etcd
    await etcd etcd_ready
    spawn kube-apiserver
    await kube-apiserver apiserver_ready
    for proc in kube-controller-manager kube-scheduler kwok; do
        spawn "${proc}"
    done
    sleep 1
    for proc in kube-controller-manager kube-scheduler kwok; do
        await "${proc}" alive "${proc}"
    done
    await kube-controller-manager workloads_accepted
    log "ready on https://${HOST}:${KUBE_APISERVER_PORT} (kubeconfig ${KUBECONFIG_FILE}) in $(elapsed_since "${started}") s"
}

cmd_stop() {
    local i proc pid stopped=0
    for (( i = ${#PROCESSES[@]} - 1; i >= 0; i-- )); do
        proc="${PROCESSES[i]}"
        if pid="$(live_pid "${proc}")"; then
            kill -TERM "${pid}" 2>/dev/null || true
            wait_exit "${pid}" "${STOP_TIMEOUT_S}" || kill_hard "${pid}" "ignored SIGTERM"
            stopped=$(( stopped + 1 ))
        fi
        rm -f "$(pid_file "${proc}")"
    done
    log "stopped ${stopped} process(es)"
}

cmd_status() {
    local proc
    for proc in "${PROCESSES[@]}"; do
        alive "${proc}" || { log "not running (${proc} is down)"; return 1; }
    done
    apiserver_ready || { log "not running (/readyz does not answer)"; return 1; }
    log "running on https://${HOST}:${KUBE_APISERVER_PORT} (kubeconfig ${KUBECONFIG_FILE})"
}

main() {
    [[ $# -eq 1 ]] || usage
    validate_port KUBE_APISERVER_PORT "${KUBE_APISERVER_PORT}"
    validate_port KUBE_ETCD_PORT "${KUBE_ETCD_PORT}"
    validate_port KUBE_ETCD_PEER_PORT "${KUBE_ETCD_PEER_PORT}"
    run_build_start_stop_status "$1"
}

main "$@"
