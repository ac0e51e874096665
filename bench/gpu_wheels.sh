#!/usr/bin/env bash
# bench/gpu_suite.sh wheels: HERE (with the network), the wheels of what the GPU suite
# imports and the device's image lacks, for its Python (3.12, x86-64), into .whl/
# (git-ignored through .git/info/exclude), at the versions this checkout's .venv holds.
# The device call then names .whl in `carry`; bench/gpu_suite.sh installs them there.
#
# The list is what the suite's processes imported here (plan, train step, apply, replay,
# a testnet's coordinator and clients, bench/optimizers.py) minus the device image's
# package list (/work/.library/device/KINDS.md): pydantic and its parts, iroh, blake3,
# bsdiff4, tomli-w, cryptography and cffi; and our versions of typing-extensions, typer and
# click, which pydantic and our CLIs need at least as new as this checkout's.
set -eu
cd "$(dirname "$0")/.."
py_version=${GPU_PYTHON_VERSION:-3.12}
pip=(.venv/bin/python -m pip)
[ -x .venv/bin/python ] || pip=(python3 -m pip)
packages=(pydantic pydantic-core annotated-types typing-inspection pydantic-settings
          python-dotenv iroh blake3 bsdiff4 tomli-w cryptography cffi pycparser
          typing-extensions typer click)  # the last three: the image has them, maybe older
pinned=()
for name in "${packages[@]}"; do
  version=$("${pip[@]}" show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  pinned+=("$name${version:+==$version}")
done
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
platforms=()
for n in 17 24 26 27 28 31 34 35 38 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$py_version" \
  --implementation cp "${platforms[@]}" -d .whl "${pinned[@]}"
ls -la .whl
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/: name .whl in the device call's carry"
