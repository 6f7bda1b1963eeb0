#!/usr/bin/env bash
# Re-lock the project's Python environments: each requirements/NAME.lock from its inputs
# (requirements/*.in and versions.env; scripts/lib/locks.py declares which), hash-locked, with
# uv (the pin in requirements/test-core.in, in a cached venv of its own). Pins that still
# resolve are kept, so re-locking unchanged inputs changes nothing.
# Usage: scripts/lock.sh [NAME...]   (default: every lock; `scripts/lock.sh --list` names them)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/venv.sh
source "${REPO}/scripts/lib/venv.sh"
LOCKS_PY="${REPO}/scripts/lib/locks.py"
mapfile -t all < <(python3 "${LOCKS_PY}" names)

if [[ "${1:-}" == --list ]]; then
  printf '%s\n' "${all[@]}"
  exit 0
fi
names=("$@")
((${#names[@]} > 0)) || names=("${all[@]}")

# uv itself, pinned with its hash in test-core.lock, in a venv keyed on that pin.
install_uv_venv() {
  "$1/bin/python" -m pip install --quiet --no-deps --require-hashes \
    -r <(python3 "${LOCKS_PY}" pin test-core uv)
}
uv_venv="$(ensure_venv uv "$(command -v python3)" install_uv_venv \
  <(python3 "${LOCKS_PY}" pin test-core uv))"

for name in "${names[@]}"; do
  log "lock ${name}"
  python3 "${LOCKS_PY}" write "${uv_venv}/bin/uv" "${name}"
done
python3 "${LOCKS_PY}" stale >&2 || true
