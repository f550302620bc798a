#!/usr/bin/env bash
# The compose stack's base images from reachable sources, for a machine that cannot pull from an image
# registry (ENVIRONMENT.md, "Docker"): Debian's packages and PyPI.
#
#   pipelinerl/debian:bookworm   Debian 12 (minbase) with Python 3.11 and its venv module, made with
#                                debootstrap and `docker import`: the platform image's PYTHON_IMAGE
#   pipelinerl/postgres:15       PostgreSQL 15 from Debian on it (docker/postgres/Dockerfile): POSTGRES_IMAGE
#
# and the machine's CPU torch wheel in docker/wheels/ (where pip finds it: PIP_FIND_LINKS or pip's
# find-links), which docker/Dockerfile installs instead of download.pytorch.org's. The root file system
# is cached in ~/.cache/pipelinerl/compose; an image that exists is kept. Prints the settings for
# docker-compose.yml. Users who can pull keep the official images (python:3.11-slim, postgres:15).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${PIPELINERL_CACHE:-$HOME/.cache/pipelinerl}/compose
torch_version=${TORCH_VERSION:-2.13.0}
python_image=pipelinerl/debian:bookworm
postgres_image=pipelinerl/postgres:15
mkdir -p "$cache"

# The machine's own certificate authorities (/usr/local/share/ca-certificates: a TLS-inspecting proxy's,
# as on the machines this was built on) go into the base image, and pip and Python's ssl use the system
# bundle there, so that builds reach PyPI as the machine does. The cached root file system is keyed by them.
local_cas=$(cat /usr/local/share/ca-certificates/*.crt 2> /dev/null | sha256sum | cut -c1-12)

if ! docker image inspect "$python_image" > /dev/null 2>&1; then
    tarball="$cache/debian-bookworm-python-$local_cas.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap > /dev/null || {
            echo "compose-base.sh: debootstrap is not installed (Debian: apt-get install debootstrap)" >&2
            exit 1
        }
        rootfs=$(mktemp -d)
        chmod 0755 "$rootfs"  # the image's /: mktemp made it 0700, which no user but root could enter
        trap 'rm -rf "$rootfs"' EXIT
        started=$(date +%s)
        echo "compose-base.sh: debootstrap bookworm from $mirror (a few minutes)"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" \
            > "$cache/debootstrap.log" 2>&1 || {
            tail -n 20 "$cache/debootstrap.log" >&2
            exit 1
        }
        if ls /usr/local/share/ca-certificates/*.crt > /dev/null 2>&1; then
            cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
            chroot "$rootfs" update-ca-certificates > /dev/null
        fi
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
        echo "compose-base.sh: root file system in $(($(date +%s) - started)) s, $(du -h "$tarball" | cut -f1)"
    fi
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["/bin/bash"]' "$tarball" "$python_image" > /dev/null
    echo "compose-base.sh: imported $python_image"
fi

if ! docker image inspect "$postgres_image" > /dev/null 2>&1; then
    started=$(date +%s)
    # --network host: a daemon started with --bridge=none gives build steps no network otherwise.
    docker build -q --network host --build-arg DEBIAN_IMAGE="$python_image" -t "$postgres_image" \
        -f "$root/docker/postgres/Dockerfile" "$root" > /dev/null
    echo "compose-base.sh: built $postgres_image in $(($(date +%s) - started)) s"
fi

# The CPU torch wheel from pip's find-links directories, if the machine has one.
if ! ls "$root"/docker/wheels/torch-"$torch_version"*.whl > /dev/null 2>&1; then
    links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2> /dev/null || true)}
    for directory in $links; do
        wheel=$(ls "$directory"/torch-"$torch_version"+cpu-*.whl 2> /dev/null | head -n 1 || true)
        if [ -n "$wheel" ]; then
            cp "$wheel" "$root/docker/wheels/"
            echo "compose-base.sh: $(basename "$wheel") into docker/wheels/"
            break
        fi
    done
fi

echo "PYTHON_IMAGE=$python_image POSTGRES_IMAGE=$postgres_image BUILD_NETWORK=host"
