#!/usr/bin/env bash
# Build the local CPU base image psyche-base:bookworm (no registry can be reached here):
# a debootstrapped minbase Debian bookworm with python3 (3.11), pip, venv and CA certificates,
# imported with `docker import`. Idempotent: does nothing when the image already exists.
#   scripts/build_base_image.sh [IMAGE]      (default psyche-base:bookworm)
# GPU users build the client on a CUDA base instead (Dockerfile.client's BASE build argument).
set -euo pipefail

IMAGE=${1:-psyche-base:bookworm}
SUITE=bookworm

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "build_base_image: $IMAGE exists"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build_base_image: must run as root (debootstrap)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi

# The mirror apt is configured with (deb822 "URIs:" or one-line "deb URL suite"); the default otherwise.
MIRROR=${DEBIAN_MIRROR:-$(
    { grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
      grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } | grep -v security | head -n1 || true
)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

ROOTFS=$(mktemp -d /tmp/psyche-base-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
echo "build_base_image: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR" >/tmp/psyche-debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/psyche-debootstrap.log >&2; exit 1; }
# Keep the image small: package caches and lists are not needed at run time.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "build_base_image: built $IMAGE"
