#!/usr/bin/env bash
# The project's one test command (CI runs exactly this): builds or reuses the cached test
# venvs, lints, then runs pytest. Arguments go to pytest, e.g. `./scripts/test.sh -k patch`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/venv.sh
source "${REPO}/scripts/lib/venv.sh"
# shellcheck source=scripts/lib/installers.sh
source "${REPO}/scripts/lib/installers.sh"
set -a
# shellcheck source=versions.env
source "${REPO}/versions.env"
set +a

# The local torch wheels are built for CPython 3.11.
PYTHON="${SPARKSERVE_PYTHON:-$(command -v python3.11 || command -v python3)}"

core="$(ensure_venv core "${PYTHON}" install_core_venv \
  "${REPO}/requirements/test-core.txt" "${REPO}/requirements/test-core-nodeps.txt" \
  "${REPO}/versions.env" "${REPO}/scripts/lib/installers.sh")"
SPARKSERVE_VLLM_BUGGY_SRC="$(ensure_vllm_source "${VLLM_BUGGY_VERSION}")"
export SPARKSERVE_VLLM_BUGGY_SRC
export VLLM_TARGET_DEVICE=cpu
export PATH="${core}/bin:${PATH}"

log "lint"
"${REPO}/scripts/lint.sh"

log "pytest"
cd "${REPO}"
PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}" exec "${core}/bin/python" -m pytest "$@"
