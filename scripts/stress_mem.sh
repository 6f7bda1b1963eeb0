#!/usr/bin/env bash
# Fill a running vLLM server's KV pool at a bank of concurrency levels while sampling host
# memory; PASS when swap did not grow and MemAvailable stayed above OS_RESERVE_GB. On a pair
# (CLUSTER_NODES=2 in .env) it also reads both hosts' memory from the head's pair watch.
# Usage: scripts/stress_mem.sh [--url http://127.0.0.1:8000] [--bank 1,2,3,4] [...]
# (`scripts/stress_mem.sh --help` lists every option; docs/PROOF-TOOLS.md explains them.)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# In the running server's container (its settings, nothing to install here), else on the
# host's Python; results in --out or results/ (scripts/lib/host_tool.sh says how it chooses).
# shellcheck source=scripts/lib/host_tool.sh
source "${REPO}/scripts/lib/host_tool.sh"
run_host_tool stress "$@"
