#!/usr/bin/env bash
# The GPU suite (docs/gpu_suite.md): one call, one JSON line, written to
# bench/results/gpu_suite_<call>_<device>_<commit>.json (and to $OUT when it is set).
#
#     bench/gpu_suite.sh speed [--smoke]    1 B Llama step, apply of 64 peers, 2-client testnet,
#                                           GPU replay distances, profiler table, docker check
#     bench/gpu_suite.sh learn [--smoke]    bench/optimizers.py on the 125 M Llama, 4 workers
#     bench/gpu_suite.sh wheels             HERE (with the network): the cp312 wheels of what
#                                           the device's image lacks, into .whl/ (git-ignored),
#                                           to name in the device call's `carry`
#
# The device machine has no network: its python3 holds torch (CUDA), transformers and
# safetensors, but not pydantic, iroh & co. This script picks a Python and, where it lacks
# our dependencies, installs .whl/*.whl (when carried) into a scratch folder on PYTHONPATH.
# What still cannot run is said in the JSON line (its `errors`), never a failed call.
# --smoke: tiny sizes on CPU, in seconds (tests/bench/test_gpu_suite.py runs it).
set -u
cd "$(dirname "$0")/.." || exit 2
call=${1:-}
case "$call" in
  speed|learn) shift ;;
  wheels) shift; exec bench/gpu_wheels.sh "$@" ;;
  *) echo "usage: bench/gpu_suite.sh speed|learn [--smoke] | wheels" >&2; exit 2 ;;
esac

# The Python: $PYTHON, else this checkout's virtualenv when it runs, else python3.
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
    python=.venv/bin/python
  else
    python=python3
  fi
fi
# Our dependencies that the device's image lacks: from carried wheels, when there are any.
setup_note=""
if ! "$python" -c "import pydantic, tomli_w, blake3, iroh" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    site=${GPU_SUITE_SITE:-/tmp/gpu_suite_site}
    if "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$site" .whl/*.whl >/tmp/gpu_suite_pip.log 2>&1; then
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
      setup_note="installed $(ls .whl/*.whl | wc -l) carried wheels into $site"
    else
      setup_note="pip could not install .whl/: $(tail -1 /tmp/gpu_suite_pip.log)"
    fi
  else
    setup_note="no .whl/ carried: run bench/gpu_suite.sh wheels here and carry .whl"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# No hub look-ups: every model is local (no network on the device; a look-up would wait).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export GPU_SUITE_SETUP_NOTE="$setup_note" GPU_SUITE_PYTHON="$python"
commit=${GPU_SUITE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${GPU_SUITE_COMMIT:-}" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
exec "$python" -m bench.gpu_suite "$call" --commit "$commit" "$@"
