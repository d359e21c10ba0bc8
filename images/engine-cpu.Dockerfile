# syntax=docker/dockerfile:1
# The CPU engine image: `pagedinfer serve` on CPU-only PyTorch, for laptop
# clusters and InferenceServices with gpus: 0 (no CUDA libraries, a fraction
# of the CUDA image's size). GPU clusters use images/engine.Dockerfile.
#
#   docker build -f images/engine-cpu.Dockerfile -t ghcr.io/pagedinfer/pagedinfer:0.1.0-cpu .
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
# The torch release the engine is tested with (the CUDA image's base has the
# same). PyPI's Linux torch is the CUDA build with GBs of nvidia-* wheels; the
# CPU build (2.13.0+cpu, which outranks it) is on PyTorch's CPU index.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /wheels
# g++ builds the native CPU attention on first use (kernels/cpu/build.py, ninja comes from pip);
# without it the engine falls back to the slower torch attention with one warning. Installed unless
# the base has it already (scripts/build_images.sh builds from a cached layer that does).
# hadolint ignore=DL3008
RUN command -v g++ >/dev/null \
    || { apt-get update \
         && apt-get install -y --no-install-recommends g++ \
         && rm -rf /var/lib/apt/lists/*; }
RUN python -m pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" "$(ls /wheels/pagedinfer-*.whl)[engine]" \
    && rm -rf /wheels \
    && useradd --uid 1000 --user-group --create-home --home-dir /home/pagedinfer --shell /usr/sbin/nologin pagedinfer
ENV HOME=/home/pagedinfer \
    HF_HOME=/home/pagedinfer/.cache/huggingface \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/pagedinfer
USER 1000:1000
EXPOSE 8000
ENTRYPOINT ["pagedinfer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
