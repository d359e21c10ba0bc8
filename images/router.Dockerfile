# syntax=docker/dockerfile:1
# The router image: `pagedinfer router` on slim Python, with pagedinfer[router]
# only: no torch, transformers or triton (tokenizers + jinja2 tokenize requests).
#
#   docker build -f images/router.Dockerfile -t ghcr.io/pagedinfer/pagedinfer-router:0.1.0 .
#
# It installs requirements/router.lock and nothing else: every package at the
# version and sha256 the suite was tested with (scripts/lock.sh), then the
# pagedinfer wheel, built by the lock's own setuptools and wheel.
#
# The base is pinned to an exact patch release and Debian suite. Python 3.11:
# the lock is resolved for CPython 3.11 (CI's and scripts/build_images.sh's
# Debian bookworm python3), so its compiled wheels are cp311 ones.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS wheel
# The lock travels to the final stage beside the wheel (in /wheels).
COPY requirements/router.lock /wheels/
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY engine ./engine
COPY kernels ./kernels
COPY operator ./operator
COPY router ./router
COPY testing ./testing
# pip runs from /, not /src: `python -m` puts the working directory on sys.path,
# where operator/ would shadow the standard library's operator module.
WORKDIR /
# The wheel is built by the lock's pip, setuptools and wheel, with packaging,
# which wheel needs (tests/images checks that is their whole closure), and
# --no-build-isolation: pip fetches no unpinned build requirements.
RUN awk '/^[^ #]/ { keep = /^(packaging|pip|setuptools|wheel)==/ } keep' /wheels/router.lock >/tmp/build.lock \
    && python -m pip install --no-cache-dir --require-hashes --no-deps -r /tmp/build.lock \
    && python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels /src

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /wheels
# The lock is the whole closure: installed as it is (--no-deps, every file's
# sha256 checked), then the wheel with --no-index, so its extra's requirements
# can only be met by what the lock installed (a missing one fails the build,
# nothing is resolved from an index), and pip check fails it on any unmet
# requirement of the packages installed.
RUN python -m pip install --no-cache-dir --require-hashes --no-deps -r /wheels/router.lock \
    && python -m pip install --no-cache-dir --no-index "$(ls /wheels/pagedinfer-*.whl)[router]" \
    && python -m pip check \
    && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pagedinfer
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The router's OpenAI front, /health and /metrics.
EXPOSE 8080
ENTRYPOINT ["pagedinfer"]
CMD ["router", "--host", "0.0.0.0", "--discover-service", "engines"]
