#!/usr/bin/env bash
# serve.sh: Qwen3.5-122B-A10B with the DFlash block-diffusion drafter on a DGX Spark.
#
# DFlash drafts NUM_SPEC_TOKENS tokens per step in one non-causal pass of a small drafter
# (DRAFT_MODEL) that shares the target's embedding and lm-head.
#
# Every setting is an environment variable (a "knob"); docs/KNOBS.md lists them with their
# defaults, allowed values, reasons, and the order in which a value is chosen. DRY_RUN=1
# prints the command instead of running it. The steps are serve_common.sh's `serve`.
set -euo pipefail

readonly PROG="serve.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=serve_common.sh
source "${here}/serve_common.sh"
refuse_arguments "$@"
serve dflash
