#!/usr/bin/env bash
# A base image made here from Debian's packages, for building the image where no image
# registry is reachable (make image-base-local): a minimal Debian 12 (bookworm), imported as
# labkit-base:bookworm. Build on it with BASE_IMAGE=labkit-base:bookworm (docker/README.md).
# It stands in for the CUDA base: it has no CUDA driver hooks, so it is for smoke tests only.
# Needs root, debootstrap and a Docker engine.
#   docker/local-base.sh [TAG] [MIRROR]
set -euo pipefail
TAG=${1:-labkit-base:bookworm}
MIRROR=${2:-http://deb.debian.org/debian}
DOCKER=${DOCKER:-docker}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
chmod 755 "$rootfs" # it becomes the image's /: mktemp's 0700 would lock every other user out
debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
# The image's own RUN updates the lists; an image ships none.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
# docker import sets no environment: PATH as in Debian's own images.
tar -C "$rootfs" --numeric-owner -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$TAG"
"$DOCKER" image inspect --format "$TAG: {{.Size}} bytes" "$TAG"
