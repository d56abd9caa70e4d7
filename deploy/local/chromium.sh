#!/usr/bin/env bash
# Installs Debian's `chromium` for the web console's browser test when it is missing, and prints
# the path of the browser. Safe to run again: an installed browser is only reported.
#
#   deploy/local/chromium.sh          install if needed; print the path (stdout, one line)
#
# The test drives this system browser with Playwright (`executable_path`); Playwright's own
# browser downloads are never used, so the browser comes from the same signed Debian mirror as
# everything else and is updated with the system.
#
# Environment:
#   CHROMIUM   a browser to use instead (checked to start, and printed; nothing installed).
#              The browser tests read the same variable, which deploy/local/test.sh exports.
set -euo pipefail

say() { printf 'chromium: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Debian installs /usr/bin/chromium (a wrapper script around /usr/lib/chromium/chromium).
find_chromium() {
    local candidate
    for candidate in "${CHROMIUM:-}" "$(command -v chromium 2>/dev/null || true)" /usr/bin/chromium; do
        if [[ -n "${candidate}" && -x "${candidate}" ]]; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    return 1
}

apt_install() {
    # As setup.sh's apt_install: only what is missing, with a clear message where impossible.
    local missing=()
    for pkg in "$@"; do
        dpkg -s "${pkg}" >/dev/null 2>&1 || missing+=("${pkg}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v apt-get >/dev/null 2>&1 \
        || die "${missing[*]} not installed and apt-get is unavailable; install Chromium and set CHROMIUM=/path/to/it"
    local SUDO=""
    if [[ $(id -u) -ne 0 ]]; then
        # -n: never prompt for a password from a script; fail and explain instead.
        if ! command -v sudo >/dev/null 2>&1 || ! sudo -n true 2>/dev/null; then
            die "missing Debian packages: ${missing[*]}; install them (sudo apt-get update && sudo apt-get install -y ${missing[*]})"
        fi
        SUDO="sudo -n"
    fi
    say "installing ${missing[*]} from Debian packages"
    # Lock timeout: setup.sh (PostgreSQL, Redis...) may be installing at the same moment; wait
    # for its dpkg lock instead of failing at once.
    ${SUDO} env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq \
        || die "apt-get update failed (no network or package mirror?)"
    ${SUDO} env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get could not install ${missing[*]}; install it manually: apt-get install -y ${missing[*]}"
}

if [[ -n "${CHROMIUM:-}" ]]; then
    # A browser named by hand is used as it is (nothing installed), and checked like ours.
    [[ -x "${CHROMIUM}" ]] || die "CHROMIUM=${CHROMIUM} is not an executable"
    path="${CHROMIUM}"
elif ! path="$(find_chromium)"; then
    # fonts-liberation: without a font package the headless pages (and the README's
    # screenshots) render text as boxes on a minimal image.
    apt_install chromium fonts-liberation
    path="$(find_chromium)" || die "apt-get finished but no chromium on PATH"
fi
# A browser that cannot start (a missing library) should fail here, not inside a test.
"${path}" --version >/dev/null 2>&1 || die "${path} --version failed; is the chromium package complete?"
printf '%s\n' "${path}"
