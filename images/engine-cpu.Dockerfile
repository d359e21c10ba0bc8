# syntax=docker/dockerfile:1
# The CPU engine image: `pagedinfer serve` on CPU-only PyTorch, for laptop
# clusters and InferenceServices with gpus: 0 (no CUDA libraries, a fraction
# of the CUDA image's size). GPU clusters use images/engine.Dockerfile.
#
#   docker build -f images/engine-cpu.Dockerfile -t ghcr.io/pagedinfer/pagedinfer:0.1.0-cpu .
#
# The native CPU kernels (kernels/cpu/csrc) are compiled once, here, in the
# `kernels` stage, and the image ships the library, root-owned and read-only
# to the engine's user: a pod loads it at start and compiles nothing (the
# engine logs "native CPU kernels: prebuilt library ..."). The image carries
# no compiler: the library is built for exactly these sources and this torch
# (its name is their hash), so only a changed source would need one, and a
# changed source means a rebuilt image, whose own `kernels` stage compiles
# it. Without the library and a compiler the engine would take the slower
# torch path with one warning, never fail; the last RUN below makes sure the
# image never ships that way.
#
# It installs requirements/engine-cpu.lock and nothing else: every package at
# the version and sha256 the suite was tested with (scripts/lock.sh), torch's
# CPU build included, then the pagedinfer wheel, built by the lock's own
# setuptools and wheel.
#
# The base is pinned to an exact patch release and Debian suite. Python 3.11:
# the lock is resolved for CPython 3.11 (CI's and scripts/build_images.sh's
# Debian bookworm python3), so its compiled wheels are cp311 ones.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
# The `kernels` stage's image: the base itself (the stage installs g++), or
# the base with g++ already in a layer (scripts/build_images.sh passes its cached one).
ARG COMPILER_IMAGE=${BASE_IMAGE}
# Where torch comes from. Its release is the lock's, 2.13.0+cpu
# (requirements/pins.txt), the one the engine is tested with and the CUDA
# image's base has: PyPI's Linux torch is the CUDA build with GBs of nvidia-*
# wheels, while the CPU build is on PyTorch's CPU index (its sha256 is the lock's).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${BASE_IMAGE} AS wheel
# The lock travels to the runtime stage beside the wheel (in /wheels).
COPY requirements/engine-cpu.lock /wheels/
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
RUN awk '/^[^ #]/ { keep = /^(packaging|pip|setuptools|wheel)==/ } keep' /wheels/engine-cpu.lock >/tmp/build.lock \
    && python -m pip install --no-cache-dir --require-hashes --no-deps -r /tmp/build.lock \
    && python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels /src

# The image's packages, installed once: the final stage is this stage plus the library, and the `kernels`
# stage compiles against this stage's torch through a read-only bind mount instead of installing it again.
FROM ${BASE_IMAGE} AS runtime
ARG TORCH_INDEX_URL
COPY --from=wheel /wheels /wheels
# The lock is the whole closure: installed as it is (--no-deps, every file's
# sha256 checked), then the wheel with --no-index, so its extra's requirements
# can only be met by what the lock installed (a missing one fails the build,
# nothing is resolved from an index), and pip check fails it on any unmet
# requirement of the packages installed.
RUN python -m pip install --no-cache-dir --require-hashes --no-deps --extra-index-url "${TORCH_INDEX_URL}" \
        -r /wheels/engine-cpu.lock \
    && python -m pip install --no-cache-dir --no-index "$(ls /wheels/pagedinfer-*.whl)[engine]" \
    && python -m pip check \
    && rm -rf /wheels \
    && useradd --uid 1000 --user-group --create-home --home-dir /home/pagedinfer --shell /usr/sbin/nologin pagedinfer

FROM ${COMPILER_IMAGE} AS kernels
# hadolint ignore=DL3008
RUN command -v g++ >/dev/null \
    || { apt-get update \
         && apt-get install -y --no-install-recommends g++ \
         && rm -rf /var/lib/apt/lists/*; }
# The runtime stage's packages (torch, ninja, pagedinfer) at the same paths under /runtime: both stages
# start from the same base, so its Python and site-packages path are this stage's. The library is built
# for exactly the torch the image ships (its hash covers torch's release).
RUN --mount=type=bind,from=runtime,source=/,target=/runtime \
    site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && bin="$(dirname "$(command -v python)")" \
    && PYTHONPATH="/runtime${site}" PATH="/runtime${bin}:${PATH}" PYTHONDONTWRITEBYTECODE=1 \
       python -m pagedinfer.kernels.cpu.build --out /opt/pagedinfer/cpu-kernels

FROM runtime
# Root-owned (0755 folder, 0644 library): the engine's user loads it and cannot change it.
COPY --from=kernels /opt/pagedinfer/cpu-kernels /opt/pagedinfer/cpu-kernels
ENV PAGEDINFER_CPU_KERNELS_DIR=/opt/pagedinfer/cpu-kernels \
    HOME=/home/pagedinfer \
    HF_HOME=/home/pagedinfer/.cache/huggingface \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The library loads here, with no compiler, for exactly this image's sources and torch.
RUN python -m pagedinfer.kernels.cpu.build --check
WORKDIR /home/pagedinfer
USER 1000:1000
EXPOSE 8000
ENTRYPOINT ["pagedinfer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
