#!/usr/bin/env bash
# mtp_serve.sh: Qwen3.5-122B-A10B drafting with its own multi-token-prediction (MTP) head.
#
# No separate drafter to download; fewer tokens accepted per step than DFlash. Same knobs as
# serve.sh (docs/KNOBS.md) except DRAFT_MODEL and DRAFT_ATTENTION_BACKEND, which MTP ignores.
set -euo pipefail

readonly PROG="mtp_serve.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=serve_common.sh
source "${here}/serve_common.sh"
refuse_arguments "$@"

# 1. Validate every knob and check GPU_MEM against this machine's memory; fill in defaults.
resolve_knobs mtp

# 2. The arguments shared with serve.sh: model, limits, memory, prefix cache, parsers.
common_vllm_args

# 3. The model's MTP layer drafts NUM_SPEC_TOKENS tokens per step.
if (( NUM_SPEC_TOKENS > 0 )); then
  speculative="{\"method\":\"mtp\",\"num_speculative_tokens\":${NUM_SPEC_TOKENS}"
  VLLM_ARGS+=(--speculative-config "${speculative}${WORKAROUND_SPECULATIVE_FIELDS}}")
fi

# 4. Anything else the user asked for, then hand the process over to vLLM.
append_extra_args
start_vllm
