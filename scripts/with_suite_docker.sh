#!/usr/bin/env bash
# Run a command against the suite's own Docker Engine, as ./scripts/test.sh prepares it: the
# cpu image built and loaded, dockerd started or joined (a shared lock on it while the command
# runs), Compose v2 as its plugin, DOCKER_HOST, DOCKER_CONFIG and SPARKSERVE_CPU_IMAGE
# exported and the core venv first on PATH. For benchmarks that need Docker, e.g.
#   ./scripts/with_suite_docker.sh env PYTHONPATH=src:tests python benchmarks/refusal_restarts.py
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/suite.sh
source "${REPO}/scripts/lib/suite.sh"

(($# > 0)) || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
PYTHON="${SPARKSERVE_PYTHON:-$(command -v python3.11 || command -v python3)}"
core="$(ensure_venv core "${PYTHON}" install_core_venv \
  "${REPO}/requirements/test-core.lock" "${REPO}/scripts/lib/installers.sh")"
prepare_suite_docker "${REPO}" "${core}"
export PATH="${core}/bin:${PATH}"
cd "${REPO}"
"$@"
