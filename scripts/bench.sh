#!/usr/bin/env bash
# Benchmark a running vLLM server: TTFT cold against warm, decode tokens/s per stream and in
# aggregate, speculative acceptance and prefix-cache hits from its /metrics counters.
# Usage: scripts/bench.sh [--url http://127.0.0.1:8000] [--concurrency 1,2,3] [...]
# (`scripts/bench.sh --help` lists every option; docs/PROOF-TOOLS.md explains them.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# The checkout's own package when run from one; the installed package (the image) otherwise.
if [[ -d "${REPO}/src/sparkserve" ]]; then
  export PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}"
fi
# Knobs (PORT, API_KEY, OS_RESERVE_GB, ...) from the checkout's .env, as compose reads them;
# the environment and a later --env-file win.
exec "${PYTHON}" -m sparkserve bench --env-file "${SPARKSERVE_ENV_FILE:-${REPO}/.env}" "$@"
