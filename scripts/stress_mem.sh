#!/usr/bin/env bash
# Fill a running vLLM server's KV pool at a bank of concurrency levels while sampling host
# memory; PASS when swap did not grow and MemAvailable stayed above OS_RESERVE_GB. On a pair
# (CLUSTER_NODES=2 in .env) it also reads both hosts' memory from the head's pair watch.
# Usage: scripts/stress_mem.sh [--url http://127.0.0.1:8000] [--bank 1,2,3,4] [...]
# (`scripts/stress_mem.sh --help` lists every option; docs/PROOF-TOOLS.md explains them.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# The checkout's own package when run from one; the installed package (the image) otherwise.
if [[ -d "${REPO}/src/sparkserve" ]]; then
  export PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}"
fi
# Knobs (PORT, API_KEY, OS_RESERVE_GB, ...) from the checkout's .env, as compose reads them;
# the environment and a later --env-file win.
exec "${PYTHON}" -m sparkserve stress --env-file "${SPARKSERVE_ENV_FILE:-${REPO}/.env}" "$@"
