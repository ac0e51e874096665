#!/usr/bin/env bash
# From a fresh machine to a working checkout. Idempotent: run it again any time.
#   ./install.sh                 .venv with the runtime + Debian's clang/lld (on-chain programs)
#   ./install.sh --dev           + test and lint tools, Prometheus (telemetry tests)
#   ./install.sh --dev --docker  + Docker engine started, base and client images built,
#                                  Debian's docker-registry (the run-manager's container
#                                  tests need them)
# System packages are installed with apt-get when running as root; otherwise a missing
# one is reported with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")"

DEV=0
DOCKER=0
for arg in "$@"; do
    case "$arg" in
        --dev) DEV=1 ;;
        --docker) DOCKER=1 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option '$arg' (known: --dev, --docker)" >&2; exit 2 ;;
    esac
done

log() { echo "install.sh: $*"; }

# ------------------------------------------------------------------ Debian packages
apt_packages=(clang lld llvm)
[ "$DEV" = 1 ] && apt_packages+=(prometheus)
# The image registry the run-manager's pull tests publish to and pull from (on loopback).
[ "$DOCKER" = 1 ] && apt_packages+=(docker-registry)
missing=()
for package in "${apt_packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        log "missing Debian packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi

# ------------------------------------------------------------------ Python
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found %s" % sys.version.split()[0]'
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
quiet() { grep -v -e "is ignored: it is neither a file nor a directory" -e "^$" || true; }
"${PIP[@]}" install --quiet --upgrade pip "setuptools>=77" wheel 2>&1 | quiet
# torch is pinned to the CPU build first: an unpinned torch would pull GBs of CUDA wheels.
"${PIP[@]}" install --quiet "torch==2.13.0" 2>&1 | quiet
if [ "$DEV" = 1 ]; then
    "${PIP[@]}" install --quiet -e ".[dev]" 2>&1 | quiet
else
    "${PIP[@]}" install --quiet -e . 2>&1 | quiet
fi

# ------------------------------------------------------------------ built artifacts
log "building the on-chain programs (clang bpfel + our linker)"
.venv/bin/python -m psyche_solana.build

if [ "$DOCKER" = 1 ]; then
    scripts/docker_engine.sh start
    scripts/build_base_image.sh
    scripts/build_client_image.sh
fi
log ".venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
