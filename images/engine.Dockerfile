# syntax=docker/dockerfile:1
# The engine image: `pagedinfer serve` (engine, Triton kernels, OpenAI-compatible
# server: pagedinfer[gpu]) on a CUDA PyTorch base. The operator runs it in every engine pod.
#
#   docker build -f images/engine.Dockerfile -t ghcr.io/pagedinfer/pagedinfer:0.1.0 .
#
# The base is pinned to an exact tag (PyTorch, CUDA and cuDNN versions all
# named): torch 2.13.0, the release the engine is tested with, on CUDA 12.6
# (NVIDIA driver >= 560). Pin it further by digest in your registry mirror.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

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
# The base image's torch (built for its CUDA) is kept: the constraint stops pip
# from replacing it with a different multi-GB build while resolving the extra.
COPY --from=wheel /wheels /wheels
RUN python -c "import torch; print('torch==' + torch.__version__)" > /tmp/constraints.txt \
    && python -m pip install --no-cache-dir -c /tmp/constraints.txt \
        "$(ls /wheels/pagedinfer-*.whl)[gpu]" \
    && rm -rf /wheels /tmp/constraints.txt \
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
