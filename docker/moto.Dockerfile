# A stand-in for the motoserver/moto image when no registry is reachable (docker/local-base.sh builds it): moto's
# server, listening on MOTO_PORT (default 5000) like the official image. inferq needs only ECS and CloudWatch,
# which run on moto's own requirements plus Flask: moto[server] would add cfn-lint, docker and a dozen more.

ARG PYTHON_IMAGE=python:3.13-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/moto \
    && /opt/moto/bin/python -m pip install --no-cache-dir --only-binary=:all: \
        "moto==5.2.*" "flask==3.*" "flask-cors==6.*" \
    && /opt/moto/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/moto /opt/moto
RUN useradd --system --uid 10002 --user-group --create-home --home-dir /home/moto moto
ENV PATH=/opt/moto/bin:$PATH \
    MOTO_PORT=5000 \
    PYTHONUNBUFFERED=1
USER 10002:10002
EXPOSE 5000
CMD ["moto_server", "--host", "0.0.0.0"]
