#!/usr/bin/env bash
# Lint everything: ruff (Python), shellcheck (shell), hadolint (Dockerfile).
# Expects ruff, shellcheck and hadolint on PATH (scripts/test.sh puts its venv there).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"

ruff check --quiet .
ruff format --check --quiet .

mapfile -t shell_files < <(git ls-files --cached --others --exclude-standard \
  '*.sh' '.ci/run' | sort -u)
shellcheck --external-sources "${shell_files[@]}"

if [[ -f Dockerfile ]]; then
  hadolint Dockerfile
fi
printf '[lint] ruff, shellcheck (%d files), hadolint: clean\n' "${#shell_files[@]}"
