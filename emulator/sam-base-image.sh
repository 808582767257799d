#!/usr/bin/env bash
# Builds, with no image registry, the image `sam local` runs a python3.13 function in, and tags it as SAM names
# the AWS base image (public.ecr.aws/lambda/python:3.13-<arch>), so `sam local ... --skip-pull-image` uses it:
#
#   DOCKER_HOST=unix:///path/to/docker.sock emulator/sam-base-image.sh     # prints the tag
#
# A stand-in for AWS's image built from Debian packages: a debootstrap'ed trixie (Python 3.13) root filesystem with
# the Lambda layout: /var/task, /var/runtime with awslambdaric and boto3 (from PyPI, as the runtime has them),
# /var/runtime/bootstrap, /lambda-entrypoint.sh, /var/lang/bin/python3.13, and the runtime interface emulator that
# the SAM CLI wheel ships (samcli/local/rapid/aws-lambda-rie-<arch>). Imported with `docker import`.
#
# Cached twice: the root filesystem as a tarball in $SAM_BASE_CACHE (default ~/.cache/inferq/sam) under a hash of
# everything that goes into it (suite, packages, mirror, pinned versions, this recipe, the RIE binary, local CAs);
# the image is also tagged inferq-local/lambda-python:3.13-<arch>-<hash>, and SAM's tag is moved only when it differs. A re-import removes SAM's own
# `...-rapid-<arch>` image built on the old one (SAM would keep using it otherwise).
#
# Needs root (debootstrap, chroot), debootstrap, a Python with pip ($PYTHON, default python3), and a Docker engine
# (DOCKER_HOST is honoured).
# SAM_VENV: the aws-sam-cli venv (default .tools/sam, `make sam-tools`). DEBIAN_MIRROR overrides the mirror;
# DOCKER is the CLI to use; SAM_BASE_ARCH (x86_64 or arm64, default this machine's) the image's architecture.
set -euo pipefail
cd "$(dirname "$0")/.."

suite=trixie
packages=python3,ca-certificates
awslambdaric_version=${AWSLAMBDARIC_VERSION:-4.2.2}
boto3_version=${BOTO3_VERSION:-1.44.8}
cache=${SAM_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferq/sam}
docker=${DOCKER:-docker}
sam_venv=${SAM_VENV:-.tools/sam}
case "${SAM_BASE_ARCH:-$(uname -m)}" in
    x86_64|amd64) arch=x86_64; platform=manylinux2014_x86_64 ;;
    aarch64|arm64) arch=arm64; platform=manylinux2014_aarch64 ;;
    *) echo "sam-base-image: unsupported architecture ${SAM_BASE_ARCH:-$(uname -m)}" >&2; exit 2 ;;
esac
tag=public.ecr.aws/lambda/python:3.13-$arch

rie=$(ls "$sam_venv"/lib/python3*/site-packages/samcli/local/rapid/aws-lambda-rie-"$arch" 2>/dev/null | head -1 || true)
[ -n "$rie" ] || { echo "sam-base-image: no aws-lambda-rie-$arch in $sam_venv (run: make sam-tools)" >&2; exit 1; }

# shellcheck source=docker/rootfs.sh
. docker/rootfs.sh

build_rootfs() {  # DIR: trixie's python3 with the Lambda runtime's layout in DIR
    debootstrap_minimal "$1" "$suite" "$packages"
    mkdir -p "$1"/var/task "$1"/var/runtime "$1"/var/lang/bin "$1"/opt
    ln -s /usr/bin/python3.13 "$1"/var/lang/bin/python3.13
    ln -s python3.13 "$1"/var/lang/bin/python3
    ln -s python3.13 "$1"/var/lang/bin/python
    # The runtime's own packages, as Lambda-platform wheels for CPython 3.13, installed by this machine's pip.
    PIP_ROOT_USER_ACTION=ignore "${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --no-compile \
        --target "$1"/var/runtime --platform "$platform" --implementation cp --python-version 3.13 \
        --only-binary=:all: "awslambdaric==$awslambdaric_version" "boto3==$boto3_version" >&2
    rm -rf "$1"/var/runtime/bin
    cat >"$1"/var/runtime/bootstrap <<'EOF'
#!/bin/sh
# The function's code first on sys.path, then the runtime's packages (boto3, awslambdaric), as on AWS.
export PYTHONPATH="${LAMBDA_TASK_ROOT:-/var/task}:/opt/python:${LAMBDA_RUNTIME_DIR:-/var/runtime}${PYTHONPATH:+:$PYTHONPATH}"
exec /var/lang/bin/python3.13 -m awslambdaric "$_HANDLER"
EOF
    cat >"$1"/lambda-entrypoint.sh <<'EOF'
#!/bin/sh
# The AWS base image's entry point: the handler is the first argument; the runtime interface emulator (put there
# by `sam local`, or this image's own) serves the Invoke API and starts the bootstrap.
if [ $# -ne 1 ]; then
  echo "entrypoint requires the handler name to be the first argument" 1>&2
  exit 142
fi
export _HANDLER="$1"
RUNTIME_ENTRYPOINT=/var/runtime/bootstrap
if [ -z "${AWS_LAMBDA_RUNTIME_API}" ]; then
  exec /usr/local/bin/aws-lambda-rie $RUNTIME_ENTRYPOINT
else
  exec $RUNTIME_ENTRYPOINT
fi
EOF
    chmod 0755 "$1"/var/runtime/bootstrap "$1"/lambda-entrypoint.sh
    install -m 0755 "$rie" "$1"/usr/local/bin/aws-lambda-rie
}

key=$(rootfs_key "$suite $packages $mirror $arch $awslambdaric_version $boto3_version $(sha256sum "$rie" | cut -d' ' -f1)")
tarball=$cache/lambda-python3.13-$arch-$key.tar
if [ ! -s "$tarball" ]; then
    cached_rootfs "$tarball" sam-base-image
    # older builds of this image are of no further use
    find "$cache" -maxdepth 1 -name "lambda-python3.13-$arch-*.tar" ! -name "$(basename "$tarball")" -delete
fi

keyed=inferq-local/lambda-python:3.13-$arch-$key
image_id() { "$docker" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
if [ -z "$(image_id "$keyed")" ] || [ "$(image_id "$keyed")" != "$(image_id "$tag")" ]; then
    echo "sam-base-image: importing $tarball as $tag" >&2
    [ -n "$(image_id "$keyed")" ] || "$docker" import \
        --change 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'ENV TZ=:/etc/localtime' \
        --change 'ENV LD_LIBRARY_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib' \
        --change 'ENV LAMBDA_TASK_ROOT=/var/task' --change 'ENV LAMBDA_RUNTIME_DIR=/var/runtime' \
        --change 'WORKDIR /var/task' --change 'ENTRYPOINT ["/lambda-entrypoint.sh"]' \
        "$tarball" "$keyed" >/dev/null
    "$docker" tag "$keyed" "$tag"
    # SAM's image (the base plus its RIE layer) was built FROM the old base: remove it so SAM builds it again.
    for stale in $("$docker" images --format '{{.Repository}}:{{.Tag}}' public.ecr.aws/lambda/python \
                   | grep -- '-rapid-' || true); do
        "$docker" rmi --force "$stale" >/dev/null 2>&1 || true
    done
fi
echo "$tag"
