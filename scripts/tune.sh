#!/usr/bin/env bash
# Tune a running sparkserve server by restarting it with each candidate: `memory` finds the
# largest GPU_MEM (KV_CACHE_GB on the cpu image) that passes the stress bank with OS_RESERVE_GB
# intact, `draft` the draft length that serves a workload fastest.
# Usage: scripts/tune.sh memory [--candidates 0.85,0.8] [...] | scripts/tune.sh draft [...]
# (`scripts/tune.sh memory --help` lists every option; docs/TUNING.md explains the loops.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# The checkout's own package when run from one; the installed package (the image) otherwise.
if [[ -d "${REPO}/src/sparkserve" ]]; then
  export PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}"
fi
if (( $# == 0 )); then
  exec "${PYTHON}" -m sparkserve tune  # says which loops there are
fi
# Knobs (PORT, API_KEY, OS_RESERVE_GB, ...) from the checkout's .env, as compose reads them;
# the environment and a later --env-file win. The loop's name comes first.
loop="$1"
shift
exec "${PYTHON}" -m sparkserve tune "${loop}" --env-file "${SPARKSERVE_ENV_FILE:-${REPO}/.env}" "$@"
