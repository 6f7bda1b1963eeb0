#!/usr/bin/env bash
# Verify a running sparkserve server: restart it with each reference setting (prefix caching
# off, the bf16 head, no speculation) and check that the int8 head, speculation and prefix
# caching left its greedy output as the plain model's, and that the API answers as clients
# expect; the server is left on its starting setting (docs/VERIFY.md).
# Usage: scripts/verify.sh [--service sparkserve-mtp] [--checks head,speculation] [...]
# (`scripts/verify.sh --help` lists every option.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# The checkout's own package when run from one; the installed package (the image) otherwise.
if [[ -d "${REPO}/src/sparkserve" ]]; then
  export PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}"
fi
# Knobs (PORT, API_KEY, RECIPE, ...) from the checkout's .env, as compose reads them; the
# environment and a later --env-file win.
exec "${PYTHON}" -m sparkserve verify --env-file "${SPARKSERVE_ENV_FILE:-${REPO}/.env}" "$@"
