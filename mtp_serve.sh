#!/usr/bin/env bash
# mtp_serve.sh: Qwen3.5-122B-A10B drafting with its own multi-token-prediction (MTP) head.
#
# No separate drafter to download; fewer tokens accepted per step than DFlash. Same knobs as
# serve.sh except DRAFT_MODEL and DRAFT_ATTENTION_BACKEND, which MTP ignores.
#
# Every setting is an environment variable (a "knob"); docs/KNOBS.md lists them with their
# defaults, allowed values, reasons, and the order in which a value is chosen. DRY_RUN=1
# prints the command instead of running it. The steps are serve_common.sh's `serve`.
set -euo pipefail

readonly PROG="mtp_serve.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=serve_common.sh
source "${here}/serve_common.sh"
refuse_arguments "$@"
serve mtp
