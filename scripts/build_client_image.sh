#!/usr/bin/env bash
# Build the client image psyche-client:<project version> (also tagged :latest) from Dockerfile.client.
#   scripts/build_client_image.sh [--cuda] [--base IMAGE] [--repo NAME] [--force]
# --cuda: the GPU variant psyche-client:<version>-cuda (and :latest-cuda): torch==<the version
#    pyproject.toml pins> installed inside the image from the package registry (PyPI's Linux
#    x86_64 build carries CUDA and pulls the nvidia-* wheels; several GB, needs the network);
#    the image's pip trusts the host's PIP_CERT when set and uses PIP_INDEX_URL when set.
#    The run-manager runs it on hosts with GPUs. Never built by the tests or CI.
# 1. A wheelhouse on the host (build/wheelhouse): the dependencies and the wandb extra's once
#    (cached; refreshed when pyproject.toml's dependencies or that extra change), the project
#    wheel every time. torch comes from the pinned CPU wheel pip already finds
#    (PIP_FIND_LINKS), never an unpinned CUDA download (--cuda leaves that wheel out of the
#    context and installs the pinned version's CUDA build).
# 2. `docker build` on a context holding that wheelhouse and assets/ (the tiny model and token
#    files the local testnet's client loads); `pip install --no-index` inside.
# Idempotent: skips the build when an image with this tag was built from the same project
# wheel, Dockerfile.client and assets/ (the io.psyche.build-sha label).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=psyche-base:bookworm
REPO=psyche-client
FORCE=0
CUDA=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE=$2; shift 2 ;;
        --repo) REPO=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        --cuda) CUDA=1; shift ;;
        *) echo "build_client_image: unknown option '$1' (known: --cuda, --base, --repo, --force)" >&2; exit 2 ;;
    esac
done

PY=${PYTHON:-.venv/bin/python}
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
SUFFIX=""
if [ "$CUDA" = 1 ]; then SUFFIX="-cuda"; fi
TAG="$REPO:$VERSION$SUFFIX"
WHEELHOUSE=build/wheelhouse
DEPS="$WHEELHOUSE/deps"
PROJECT="$WHEELHOUSE/project"
CONTEXT=build/client-image-context
mkdir -p "$DEPS" "$PROJECT"

# Dependencies: rebuilt only when the dependency list changes. The image installs
# psyche-py[wandb] (W&B logging from the container), so the wandb extra's are in it too.
DEPS_STAMP=$("$PY" -c 'import hashlib,json,tomllib; p=tomllib.load(open("pyproject.toml","rb"))["project"]; print(hashlib.sha256(json.dumps([p["dependencies"], p["optional-dependencies"]["wandb"]]).encode()).hexdigest())')
if [ "$(cat "$DEPS/.stamp" 2>/dev/null)" != "$DEPS_STAMP" ]; then
    echo "build_client_image: building the dependency wheelhouse (once)"
    "$PY" -c 'import tomllib; p = tomllib.load(open("pyproject.toml","rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["wandb"]))' >"$DEPS/requirements.txt"
    # pip's warnings about absent extra-index folders are noise here; real errors still show.
    "$PY" -m pip wheel --quiet --wheel-dir "$DEPS" --find-links "$DEPS" -r "$DEPS/requirements.txt" \
        2>"$DEPS/pip.log" || { grep -v "is ignored: it is neither" "$DEPS/pip.log" >&2; exit 1; }
    echo "$DEPS_STAMP" >"$DEPS/.stamp"
fi

# The project wheel: always rebuilt (the sources change), without dependencies.
rm -f "$PROJECT"/*.whl
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$PROJECT" . 2>/dev/null \
    || "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$PROJECT" .
rm -rf build/psyche_py.egg-info 2>/dev/null || true
# Everything the image is built from: the project wheel, the Dockerfile, the assets.
# The wheel's zip carries build times, so its members are hashed, not the zip itself.
WHEEL_CONTENT_SHA=$("$PY" -c 'import hashlib,sys,zipfile
z = zipfile.ZipFile(sys.argv[1]); h = hashlib.sha256()
for name in sorted(z.namelist()): h.update(name.encode() + b"\0" + z.read(name))
print(h.hexdigest())' "$PROJECT"/*.whl)
BUILD_SHA=$( { echo "$WHEEL_CONTENT_SHA$SUFFIX"; sha256sum Dockerfile.client | awk '{print $1}';
               find assets -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } \
             | sha256sum | awk '{print substr($1,1,16)}')

if [ "$FORCE" = 0 ] && [ "$(docker image inspect -f '{{ index .Config.Labels "io.psyche.build-sha" }}' "$TAG" 2>/dev/null)" = "$BUILD_SHA" ]; then
    docker tag "$TAG" "$REPO:latest$SUFFIX"
    echo "build_client_image: $TAG is up to date"
    exit 0
fi

# A minimal context (hard links, no copies): the rest of the repository is not sent to the engine.
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT/wheelhouse"
ln "$DEPS"/*.whl "$PROJECT"/*.whl "$CONTEXT/wheelhouse/" 2>/dev/null || cp "$DEPS"/*.whl "$PROJECT"/*.whl "$CONTEXT/wheelhouse/"
VARIANT_ARGS=()
if [ "$CUDA" = 1 ]; then
    # torch comes from the registry inside the image: the wheelhouse's CPU wheel stays out.
    rm -f "$CONTEXT"/wheelhouse/torch-*.whl
    TORCH_VERSION=$("$PY" -c 'import re,tomllib
deps = tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]
print(next(m[1] for d in deps if (m := re.fullmatch(r"torch\s*==\s*([^\s;,]+)", d.strip()))))')
    if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then cp "$PIP_CERT" "$CONTEXT/wheelhouse/pip-cert.pem"; fi
    VARIANT_ARGS=(--build-arg TORCH=registry --build-arg TORCH_VERSION="$TORCH_VERSION"
                  --build-arg TORCH_INDEX_URL="${PIP_INDEX_URL:-}" --label io.psyche.torch=registry-cuda)
    echo "build_client_image: --cuda: torch==$TORCH_VERSION from the registry inside the image (several GB)"
fi
cp -al assets "$CONTEXT/assets" 2>/dev/null || cp -r assets "$CONTEXT/assets"
cp Dockerfile.client "$CONTEXT/Dockerfile"
PREVIOUS_ID=$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
echo "build_client_image: docker build $TAG on $BASE"
DOCKER_BUILDKIT=0 docker build --quiet 2>&1 --network host \
    --build-arg BASE="$BASE" --build-arg VERSION="$VERSION" ${VARIANT_ARGS[@]+"${VARIANT_ARGS[@]}"} \
    --label io.psyche.build-sha="$BUILD_SHA" \
    -t "$TAG" "$CONTEXT" >/dev/null
rm -rf "$CONTEXT"
# Also :latest (:latest-cuda), the version a state.toml asks for when it names none (the local testnet).
docker tag "$TAG" "$REPO:latest$SUFFIX"
# The untagged install stage (it holds the whole wheelhouse) is of no use once built, nor
# is the image the tag pointed to before (removal fails, harmlessly, while it is in use).
docker image prune -f --filter label=io.psyche.build-stage=install >/dev/null || true
if [ -n "$PREVIOUS_ID" ] && [ "$PREVIOUS_ID" != "$(docker image inspect -f '{{.Id}}' "$TAG")" ]; then
    docker rmi "$PREVIOUS_ID" >/dev/null 2>&1 || true
fi
echo "build_client_image: built $TAG"
