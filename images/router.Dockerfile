# syntax=docker/dockerfile:1
# The router image: `pagedinfer router` on slim Python, with pagedinfer[router]
# only: no torch, transformers or triton (tokenizers + jinja2 tokenize requests).
#
#   docker build -f images/router.Dockerfile -t ghcr.io/pagedinfer/pagedinfer-router:0.1.0 .
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
RUN python -m pip install --no-cache-dir "$(ls /wheels/pagedinfer-*.whl)[router]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pagedinfer
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The router's OpenAI front, /health and /metrics.
EXPOSE 8080
ENTRYPOINT ["pagedinfer"]
CMD ["router", "--host", "0.0.0.0", "--discover-service", "engines"]
