#!/usr/bin/env bash
# Publish a built client image to a registry under a client version, for run-managers to pull.
#   scripts/publish_client_image.sh REGISTRY [--image IMAGE] [--version VERSION] [--repo NAME]
# REGISTRY: host[:port] of the registry (Docker pushes over plain HTTP only to 127.0.0.0/8;
#    any other registry needs TLS, or `insecure-registries` in the engine's daemon.json, and
#    `docker login` when it asks for one).
# IMAGE: the local image to publish (default psyche-client:<project version>, what
#    scripts/build_client_image.sh builds). VERSION: the tag to publish it as (default:
#    IMAGE's tag), the client version a run names. NAME: the repository (default
#    psyche-client). Run-managers then set CLIENT_IMAGE=REGISTRY/NAME.
# Pushes REGISTRY/NAME:VERSION; the last line printed is its digest (sha256:...).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "publish_client_image: $*" >&2; exit 1; }

REGISTRY=""
IMAGE=""
VERSION=""
REPO=psyche-client
while [ $# -gt 0 ]; do
    case "$1" in
        --image) IMAGE=${2:?--image needs a value}; shift 2 ;;
        --version) VERSION=${2:?--version needs a value}; shift 2 ;;
        --repo) REPO=${2:?--repo needs a value}; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        -*) echo "publish_client_image: unknown option '$1' (known: --image, --version, --repo)" >&2; exit 2 ;;
        *) [ -z "$REGISTRY" ] || { echo "publish_client_image: one REGISTRY only, got '$REGISTRY' and '$1'" >&2; exit 2; }
           REGISTRY=$1; shift ;;
    esac
done
[ -n "$REGISTRY" ] || { echo "usage: $0 REGISTRY [--image IMAGE] [--version VERSION] [--repo NAME]" >&2; exit 2; }

if [ -z "$IMAGE" ]; then
    PY=${PYTHON:-.venv/bin/python}
    IMAGE="psyche-client:$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')"
fi
if [ -z "$VERSION" ]; then
    VERSION=${IMAGE##*:}
    [ "$VERSION" != "$IMAGE" ] && [[ "$VERSION" != */* ]] || fail "--version is needed: $IMAGE has no tag"
fi
# A Docker tag: what the run-manager accepts as a client version.
[[ "$VERSION" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || fail "'$VERSION' is not a valid image tag"
docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || fail "no image $IMAGE on this machine: build it first (scripts/build_client_image.sh)"

TARGET="$REGISTRY/$REPO:$VERSION"
docker tag "$IMAGE" "$TARGET"
if ! output=$(docker push "$TARGET" 2>&1); then
    # The tag would pass for a published image on this machine (the run-manager uses a
    # local image as is): a push that failed leaves none.
    docker image rm "$TARGET" >/dev/null 2>&1 || true
    fail "cannot push $TARGET: $(echo "$output" | tail -n 1)"
fi
digest=$(echo "$output" | sed -n 's/.*digest: \(sha256:[0-9a-f]\{64\}\).*/\1/p' | tail -n 1)
[ -n "$digest" ] || fail "pushed $TARGET, but docker push named no digest: $(echo "$output" | tail -n 1)"
echo "publish_client_image: pushed $IMAGE as $TARGET"
echo "$digest"
