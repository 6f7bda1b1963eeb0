# sparkserve: vLLM for the NVIDIA DGX Spark (GB10, sm_121, aarch64, CUDA 13, Python 3.12).
#
# Build on the Spark itself: `docker compose build` (or `docker build -t sparkserve .`).
# Layers: a CUDA 13 base, the pinned vLLM release and its dependencies from a hash-locked
# aarch64 lock file, this project's package (the vLLM plugin and tools), the build-time
# patches, and the launchers. Nothing here is unpinned except the Ubuntu packages of the
# pinned base image.
#
# Build arguments:
#   CUDA_IMAGE  the CUDA 13 base (devel: vLLM's JIT kernels and fastsafetensors need a
#               compiler and headers at run time). Must be Ubuntu 24.04 for Python 3.12.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04

FROM ${CUDA_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    HF_HOME=/root/.cache/huggingface

# The lock is for linux/aarch64: refuse to build a silently different image elsewhere.
RUN if [ "$(uname -m)" != aarch64 ]; then \
        echo "sparkserve: this image is for the DGX Spark (aarch64), not $(uname -m)" >&2; exit 1; \
    fi

# Ubuntu's packages follow the pinned base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.12 python3.12-venv python3.12-dev curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv "${VIRTUAL_ENV}"

WORKDIR /opt/sparkserve

# vLLM and every dependency, exactly as locked (scripts/lock_image.sh); the lock must name the
# vLLM release of versions.env, the one place it is chosen.
COPY versions.env requirements/spark-aarch64.lock ./
RUN . ./versions.env; \
    if ! grep -q "^vllm==${VLLM_VERSION} " spark-aarch64.lock; then \
        echo "sparkserve: spark-aarch64.lock does not pin vllm==${VLLM_VERSION}" >&2; exit 1; \
    fi
RUN pip install --require-hashes --no-deps -r spark-aarch64.lock

# The package: the vLLM general plugin (int8 lm-head), the knob registry and the tools.
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps --no-build-isolation . && sparkserve --version

# The int8 lm-head kernels compile for the Spark (sm_121) with the Triton just installed and fit
# a GB10 block's shared memory: a Triton whose API moved stops the build, not the first request.
RUN python -m sparkserve.lmhead.compile_check --arch 121

# Build-time patches: each applies, finds vLLM already fixed, or stops the build on code it
# does not recognise (exit 3); then --check proves the installed vLLM needs nothing more.
COPY patch_prefix_align.py ./
RUN python patch_prefix_align.py && python patch_prefix_align.py --check

COPY serve.sh mtp_serve.sh serve_common.sh ./
# The tested models the RECIPE knob picks from (sparkserve.recipes looks here in the image).
COPY recipes ./recipes

EXPOSE 8000
# vLLM answers /health once the model is loaded; the first start downloads and loads ~70 GB.
HEALTHCHECK --interval=30s --timeout=10s --start-period=3600s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS \"http://127.0.0.1:${PORT:-8000}/health\" || exit 1"]

# exec form: serve.sh is PID 1 and execs vLLM, so `docker stop` (SIGTERM) reaches vLLM.
ENTRYPOINT ["/opt/sparkserve/serve.sh"]
