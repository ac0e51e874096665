#!/usr/bin/env bash
# From a fresh machine to a working .venv. Idempotent.
#   ./install.sh          runtime only
#   ./install.sh --dev    + test and lint tools
set -euo pipefail
cd "$(dirname "$0")"

DEV=0
for arg in "$@"; do
    case "$arg" in
        --dev) DEV=1 ;;
        *) echo "install.sh: unknown option '$arg' (known: --dev)" >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found %s" % sys.version.split()[0]'

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip setuptools wheel
# torch is pinned to the CPU build first: an unpinned torch would pull GBs of CUDA wheels.
$PIP install --quiet "torch==2.13.0"
if [ "$DEV" = 1 ]; then
    $PIP install --quiet -e ".[dev]"
else
    $PIP install --quiet -e .
fi
echo "install.sh: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
