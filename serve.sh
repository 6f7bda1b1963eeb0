#!/usr/bin/env bash
# serve.sh: Qwen3.5-122B-A10B with the DFlash block-diffusion drafter on a DGX Spark.
#
# Every setting is an environment variable (a "knob"); docs/KNOBS.md lists them with their
# defaults, allowed values and reasons. DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

readonly PROG="serve.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=serve_common.sh
source "${here}/serve_common.sh"
refuse_arguments "$@"

# 1. Validate every knob and check GPU_MEM against this machine's memory; fill in defaults.
resolve_knobs dflash

# 2. The arguments shared with mtp_serve.sh: model, limits, memory, prefix cache, parsers.
common_vllm_args

# 3. The drafter. DFlash drafts NUM_SPEC_TOKENS tokens per step in one non-causal pass.
if (( NUM_SPEC_TOKENS > 0 )); then
  speculative="{\"method\":\"dflash\",\"model\":\"${DRAFT_MODEL}\""
  speculative+=",\"num_speculative_tokens\":${NUM_SPEC_TOKENS}"
  if [[ -n "${DRAFT_ATTENTION_BACKEND}" ]]; then
    speculative+=",\"attention_backend\":\"${DRAFT_ATTENTION_BACKEND}\""
  fi
  VLLM_ARGS+=(--speculative-config "${speculative}${WORKAROUND_SPECULATIVE_FIELDS}}")
fi

# 4. Anything else the user asked for, then hand the process over to vLLM.
append_extra_args
start_vllm
