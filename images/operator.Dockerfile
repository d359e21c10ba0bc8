# syntax=docker/dockerfile:1
# The operator image: `pagedinfer operator` (kopf) on slim Python, with
# pagedinfer[operator] only: no torch, transformers or triton.
#
#   docker build -f images/operator.Dockerfile -t ghcr.io/pagedinfer/pagedinfer-operator:0.1.0 .
#
# The base is pinned to an exact patch release and Debian suite.
ARG BASE_IMAGE=python:3.12.11-slim-bookworm

FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY kernels ./kernels
COPY operator ./operator
COPY router ./router
COPY testing ./testing
# pip runs from /, not /src: `python -m` puts the working directory on sys.path,
# where operator/ would shadow the standard library's operator module.
WORKDIR /
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /wheels
RUN python -m pip install --no-cache-dir "$(ls /wheels/pagedinfer-*.whl)[operator]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pagedinfer
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# kopf's liveness endpoint and the operator's /metrics (the chart's defaults).
EXPOSE 8080 9090
ENTRYPOINT ["pagedinfer"]
CMD ["operator", "--all-namespaces"]
