#!/usr/bin/env bash
# Benchmark a running vLLM server: TTFT cold against warm, decode tokens/s per stream and in
# aggregate, speculative acceptance and prefix-cache hits from its /metrics counters.
# Usage: scripts/bench.sh [--url http://127.0.0.1:8000] [--concurrency 1,2,3] [...]
# `scripts/bench.sh llama-benchy [--profile arena-v2|short] [...]` runs llama-benchy instead,
# the benchmark Spark owners post, joined with the same counters.
# (`scripts/bench.sh [llama-benchy] --help` lists every option; docs/PROOF-TOOLS.md explains.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# In the running server's container (its settings, nothing to install here), else on the
# host's Python; results in --out or results/ (scripts/lib/host_tool.sh says how it chooses).
# shellcheck source=scripts/lib/host_tool.sh
source "${REPO}/scripts/lib/host_tool.sh"
if [[ "${1:-}" == llama-benchy ]]; then
  shift
  run_host_tool llama-benchy "$@"
fi
run_host_tool bench "$@"
