#!/usr/bin/env bash
# Lint everything: ruff (Python), shellcheck (shell), hadolint (Dockerfile), image digests
# (scripts/lib/image_pins.py, with PyYAML), compose-lint
# (docker-compose.yml's security). Expects ruff, shellcheck and hadolint on PATH and
# compose-lint at $COMPOSE_LINT or on PATH (scripts/test.sh sets both up).
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
# Every pulled image by digest, or listed with the reason it is not (scripts/lib/image_pins.py).
python3 scripts/lib/image_pins.py
# The committed file alone (--no-env: no local .env changes the verdict); every finding is
# fixed or accepted with its reason in .compose-lint.yml, down to the lowest severity.
if ! compose_lint="$("${COMPOSE_LINT:-compose-lint}" check --quiet --no-env --strict-config \
  --fail-on low --skip-suppressed docker-compose.yml 2>&1)"; then
  printf '%s\n' "${compose_lint}" >&2
  exit 1
fi
printf '[lint] ruff, shellcheck (%d files), hadolint, image pins, compose-lint: clean\n' "${#shell_files[@]}"
