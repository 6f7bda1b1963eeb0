#!/usr/bin/env bash
# apply-vllm-patches.sh PYTHON: every build-time patch (sparkserve.patching.ALL_PATCHES,
# docs/PATCHES.md) against the vLLM that PYTHON imports, then `--check` of each. A patch
# applies, finds vLLM already fixed, or stops here on code it does not recognise (exit 3).
# The images run it (finish-image.sh) and so does the tests' CPU serving venv, so the
# end-to-end tests serve the vLLM the cpu image ships.
set -euo pipefail

main() {
  local py="${1:?usage: apply-vllm-patches.sh PYTHON}" name
  local -a names
  read -ra names <<<"$("${py}" -c \
    'from sparkserve.patching import ALL_PATCHES; print(" ".join(ALL_PATCHES))')"
  for name in "${names[@]}"; do
    "${py}" -m sparkserve patch "${name}"
    "${py}" -m sparkserve patch "${name}" --check
  done
}

main "$@"
