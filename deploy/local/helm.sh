#!/usr/bin/env bash
# Builds helm, which installs ClusterWarden's chart (deploy/helm/clusterwarden) and which the
# chart's tests run (lint, template, install into the local API server): built once from the
# Go module proxy and cached under the state folder by version.
#
#   deploy/local/helm.sh build    build the binary if it is not cached yet
#   deploy/local/helm.sh path     build if needed, then print the binary's path
#
# Environment:
#   WARDEN_STATE_DIR   state root (default <repo>/.state); the binary is
#                      bin/helm-<version>/helm
set -euo pipefail

COMPONENT=helm
# shellcheck source=deploy/local/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# v3.22.0: built on Go 1.26 from the module proxy (its go.mod has no replace directives, so
# `go install module@version` builds it as released).
HELM_VERSION=v3.22.0
# What its release build stamps in with the linker (helm's Makefile): its version, and the
# Kubernetes version `helm template` and `helm lint` assume without a cluster, 1.<minor of
# its k8s.io/client-go> (v0.37.0). Unstamped it would assume 1.20 and refuse the chart's
# kubeVersion.
HELM_LDFLAGS="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
for pkg in pkg/lint/rules pkg/chartutil; do
    HELM_LDFLAGS+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1"
    HELM_LDFLAGS+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=37"
done
HELM_DIR="${STATE_ROOT}/bin/helm-${HELM_VERSION}"
STATE_DIR="${STATE_ROOT}/helm"
# How long a build waits for another run of this script (take_lock, common.sh): a first
# build takes minutes.
LOCK_WAIT_S=900

cmd_build() {
    [[ -x "${HELM_DIR}/helm" ]] && return 0
    local started
    started="$(now)"
    log "building helm ${HELM_VERSION} from the Go module proxy (once; minutes) ..."
    go_install_into "${HELM_DIR}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" \
        -ldflags "${HELM_LDFLAGS}"
    log "built ${HELM_DIR}/helm in $(elapsed_since "${started}") s"
}

main() {
    [[ $# -eq 1 ]] || set -- help
    case "$1" in
        build) take_lock "${LOCK_WAIT_S}"; cmd_build ;;
        path) take_lock "${LOCK_WAIT_S}"; cmd_build >&2; printf '%s\n' "${HELM_DIR}/helm" ;;
        *) printf 'usage: %s {build|path}\n' "$0" >&2; exit 2 ;;
    esac
}

main "$@"
