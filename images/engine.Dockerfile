# syntax=docker/dockerfile:1
# The engine image: `pagedinfer serve` (engine, Triton kernels, OpenAI-compatible
# server: pagedinfer[gpu]) on a CUDA PyTorch base. The operator runs it in every engine pod.
#
#   docker build -f images/engine.Dockerfile -t ghcr.io/pagedinfer/pagedinfer:0.1.0 .
#
# The base is pinned to an exact tag (PyTorch, CUDA and cuDNN versions all
# named): torch 2.13.0, the release the engine is tested with, on CUDA 12.6
# (NVIDIA driver >= 560). Pin it further by digest in your registry mirror.
#
# Everything but the base's torch is requirements/engine-cpu.lock's, at the
# version and sha256 the suite was tested with (scripts/lock.sh): that lock is
# pagedinfer[engine] with torch, and the CUDA torch is the base's own (with the
# nvidia-* libraries and the triton its wheel pins, which [gpu] adds), so the
# CPU lock less its torch line is exactly what this image adds to its base.
# A lock of its own would only repeat those lines: the CUDA torch is not
# installed from an index here, so there is nothing else for it to pin.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

FROM ${BASE_IMAGE} AS wheel
# The lock travels to the final stage beside the wheel (in /wheels).
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

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /wheels
# The lock less its torch line, installed as it is (--no-deps, every file's
# sha256 checked): the base's CUDA torch stays. Then the wheel with --no-index,
# so [gpu]'s requirements, and theirs (the base torch's too), can only be met by
# what the base and the lock installed: a missing one fails the build, nothing
# is resolved from an index. (No `pip check`: it would also judge the base's
# own conda packages, which are not this image's to vouch for.)
RUN awk '/^[^ #]/ { keep = !/^torch==/ } keep' /wheels/engine-cpu.lock >/tmp/engine.lock \
    && python -m pip install --no-cache-dir --require-hashes --no-deps -r /tmp/engine.lock \
    && python -m pip install --no-cache-dir --no-index "$(ls /wheels/pagedinfer-*.whl)[gpu]" \
    && rm -rf /wheels /tmp/engine.lock \
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
