# shellcheck shell=bash
# Shared steps of serve.sh and mtp_serve.sh; sourced, defines functions only. The launcher
# sets PROG (its own name, for messages) before sourcing this file.
: "${PROG:?the launcher sets PROG before sourcing serve_common.sh}"
# The knobs themselves (names, defaults, allowed values, why) live in one registry:
# src/sparkserve/knobs.py. Nothing here starts vLLM until every knob has passed it.

# refuse_arguments ARGS...: settings come from the environment only, so that compose, docs
# and validation see every one of them; a stray argument is a mistake, not an option.
refuse_arguments() {
  if (( $# > 0 )); then
    printf '%s: takes no arguments (got %q); set knobs in the environment, e.g. EXTRA_ARGS\n' \
      "${PROG}" "$1" >&2
    exit 2
  fi
}

# resolve_knobs LAUNCHER: validate every knob and the memory budget, fill in defaults.
# On a bad value the registry prints one line (knob, value, what is allowed) and we exit 2.
resolve_knobs() {
  local exports
  LAUNCHER="$1"
  if ! exports="$(python3 -m sparkserve knobs resolve --launcher "${LAUNCHER}" --prog "${PROG}")"; then
    exit 2
  fi
  eval "${exports}"
}

# common_vllm_args: the arguments both launchers give `vllm serve`, into VLLM_ARGS.
common_vllm_args() {
  VLLM_ARGS=(
    --model "${MODEL}"
    --served-model-name "${SERVED_MODEL_NAME}"
    --host "${HOST}"
    --port "${PORT}"
    --gpu-memory-utilization "${GPU_MEM}"
    --max-model-len "${MAX_MODEL_LEN}"
    --max-num-seqs "${MAX_NUM_SEQS}"
    --max-num-batched-tokens "${MAX_BATCHED_TOKENS}"
    --load-format "${LOAD_FORMAT}"
  )
  if [[ -n "${KV_CACHE_GB}" ]]; then
    VLLM_ARGS+=(--kv-cache-memory-bytes "${KV_CACHE_BYTES}")
  fi
  if [[ "${PREFIX_CACHE}" == 1 ]]; then
    VLLM_ARGS+=(--enable-prefix-caching)
  else
    VLLM_ARGS+=(--no-enable-prefix-caching)
  fi
  if [[ -n "${TOOL_PARSER}" ]]; then
    VLLM_ARGS+=(--enable-auto-tool-choice --tool-call-parser "${TOOL_PARSER}")
  fi
  if [[ -n "${REASONING_PARSER}" ]]; then
    VLLM_ARGS+=(--reasoning-parser "${REASONING_PARSER}")
  fi
  apply_workarounds
  cluster_vllm_args
}

# cluster_vllm_args: with CLUSTER_NODES=2, vLLM's native multi-node launch (multiprocessing
# executor: vLLM's CPU build refuses Ray, docs/CLUSTER.md). Both nodes get the same command
# but for --node-rank; the worker runs headless (no API), the head serves the API. vLLM's own
# rendezvous and collectives give up after CLUSTER_DIST_TIMEOUT_S (= CLUSTER_JOIN_TIMEOUT_S)
# instead of torch's 30 min; the pair watch (start_pair_watch) stops a broken pair sooner.
# The options, in vLLM's parser: --nnodes/--node-rank/--master-addr/--master-port and
# --distributed-timeout-seconds in engine/arg_utils.py (0.32: lines 1143-1148; 0.33:
# 1175-1180), --headless in entrypoints/launchers/cli_args.py:435 (0.32) and
# entrypoints/common/cli_args.py:445 (0.33).
cluster_vllm_args() {
  [[ "${CLUSTER_NODES}" == 2 ]] || return 0
  VLLM_ARGS+=(--nnodes 2 --node-rank "${CLUSTER_RANK}"
    --master-addr "${CLUSTER_HEAD_ADDR}" --master-port "${CLUSTER_PORT}"
    --distributed-executor-backend mp
    --distributed-timeout-seconds "${CLUSTER_DIST_TIMEOUT_S}")
  if [[ "${CLUSTER_LAYOUT}" == pp ]]; then
    VLLM_ARGS+=(--pipeline-parallel-size 2)
  else
    VLLM_ARGS+=(--tensor-parallel-size 2)
  fi
  if [[ "${CLUSTER_RANK}" == 1 ]]; then
    VLLM_ARGS+=(--headless)
  fi
}

# apply_workarounds: the arguments the installed vLLM's known bugs call for (the registry in
# src/sparkserve/workarounds.py decides; WORKAROUND_SPECULATIVE_FIELDS goes into the
# launcher's speculative config), each announced with its reason.
apply_workarounds() {
  local note
  for note in "${WORKAROUND_NOTES[@]}"; do
    printf '%s: vLLM %s: %s\n' "${PROG}" "${VLLM_FOUND_VERSION}" "${note}" >&2
  done
  VLLM_ARGS+=("${WORKAROUND_ARGV[@]}")
}

# append_extra_args: EXTRA_ARGS, split as a shell would (quotes respected, nothing expanded)
# by the registry into EXTRA_ARGV, appended last so they can override anything above.
append_extra_args() {
  VLLM_ARGS+=("${EXTRA_ARGV[@]}")
}

# export_vllm_env: the environment vLLM runs with.
export_vllm_env() {
  export HF_HOME
  # Compile artefacts on the model-cache volume: a restart reuses them instead of recompiling.
  export VLLM_CACHE_ROOT="${HF_HOME}/vllm"
  export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS SPARK_KEEP_BF16_LMHEAD SPARK_LMHEAD_CALIBRATE
  # fetch_models has put every checkpoint into the cache: vLLM never downloads.
  export HF_HUB_OFFLINE=1
  # The key goes through the environment so that it never shows in `ps` or in logs.
  if [[ -n "${API_KEY:-}" ]]; then
    export VLLM_API_KEY="${API_KEY}"
  fi
  unset API_KEY
  export_cluster_env
}

# export_cluster_env: with CLUSTER_NODES=2, keep the engine's traffic on the link.
export_cluster_env() {
  [[ "${CLUSTER_NODES}" == 2 ]] || return 0
  # The address this node announces to the other (vLLM envs.py, VLLM_HOST_IP; otherwise vLLM
  # guesses from the default route, which is not the ConnectX-7 link).
  export VLLM_HOST_IP="${CLUSTER_HOST_IP}"
  # The interface torch.distributed's Gloo backend (CPU-side groups) binds to (PyTorch docs,
  # torch.distributed: "Choosing the network interface to use").
  export GLOO_SOCKET_IFNAME="${CLUSTER_IFACE}"
  # The interface NCCL's bootstrap and socket transport use (NCCL docs, environment
  # variables: NCCL_SOCKET_IFNAME); without it NCCL may pick the wrong port.
  export NCCL_SOCKET_IFNAME="${CLUSTER_IFACE}"
  # The RoCE devices NCCL's RDMA transport uses (NCCL docs: NCCL_IB_HCA); on a Spark both
  # halves of the cabled port give the full 200 Gb/s (docs/CLUSTER.md, Cabling and addressing).
  if [[ -n "${CLUSTER_IB_HCA}" ]]; then
    export NCCL_IB_HCA="${CLUSTER_IB_HCA}"
  fi
}

# print_dry_run: the exact environment and command, secrets hidden, for DRY_RUN=1.
print_dry_run() {
  local name
  printf '%s: dry run (vLLM %s found); nothing started\n' "${PROG}" "${VLLM_FOUND_VERSION}"
  for name in HF_HOME VLLM_CACHE_ROOT VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS \
    SPARK_KEEP_BF16_LMHEAD SPARK_LMHEAD_CALIBRATE HF_HUB_OFFLINE; do
    printf 'env: %s=%s\n' "${name}" "${!name@Q}"
  done
  if [[ "${CLUSTER_NODES}" == 2 ]]; then
    for name in VLLM_HOST_IP GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME NCCL_IB_HCA; do
      if [[ -n "${!name:-}" ]]; then
        printf 'env: %s=%s\n' "${name}" "${!name@Q}"
      fi
    done
  fi
  for name in VLLM_API_KEY HF_TOKEN; do
    if [[ -n "${!name:-}" ]]; then
      printf 'env: %s=<hidden>\n' "${name}"
    fi
  done
  fetch_command
  printf 'fetch: %s\n' "${FETCH_ARGS[*]@Q}"
  if [[ "${GUARD}" == 1 ]]; then
    guard_command
    printf 'guard: %s\n' "${GUARD_ARGS[*]@Q}"
  fi
  if [[ "${CLUSTER_NODES}" == 2 ]]; then
    watch_command
    printf 'watch: %s\n' "${WATCH_ARGS[*]@Q}"
  fi
  printf 'exec: vllm serve %s\n' "${VLLM_ARGS[*]@Q}"
}

# check_guard_record: after the memory guard stopped vLLM it leaves a record on the model-cache
# volume; refuse to start (exit 3, at once: no model load, no memory taken) until a container
# created with GUARD_RESUME=1 starts. Only that container's first start may clear a record:
# it leaves a mark in the container's own filesystem (SPARKSERVE_STATE_DIR), so a restart of
# the same container, with the same environment, never clears a record written later.
check_guard_record() {
  local record="${GUARD_MARKER}"
  local spent="${SPARKSERVE_STATE_DIR:-${TMPDIR:-/tmp}}/guard-resume-spent"
  if [[ "${GUARD_RESUME}" == 1 && ! -e "${spent}" ]]; then
    mkdir -p -- "$(dirname -- "${spent}")"
    : > "${spent}"
    if [[ -f "${record}" ]]; then
      printf '%s: GUARD_RESUME=1: clearing the memory guard record %s and starting\n' \
        "${PROG}" "${record}" >&2
      rm -f -- "${record}"
    fi
    return 0
  fi
  [[ -f "${record}" ]] || return 0
  if [[ "${GUARD_RESUME}" == 1 ]]; then
    printf '%s: the memory guard stopped vLLM (%s): %s; GUARD_RESUME=1 was spent on this container'"'"'s first start: fix the cause (docs/MEMORY.md), then recreate the container (docker compose up -d --force-recreate)\n' \
      "${PROG}" "${record}" "$(tr -d '\n' < "${record}")" >&2
    exit 3
  fi
  printf '%s: the memory guard stopped vLLM last time (%s): %s; fix the cause (docs/MEMORY.md), then start once with GUARD_RESUME=1\n' \
    "${PROG}" "${record}" "$(tr -d '\n' < "${record}")" >&2
  exit 3
}

# fetch_command: the model fetch's command line, into FETCH_ARGS.
fetch_command() {
  # Online or not as HF_OFFLINE says, whatever export_vllm_env decided for vLLM.
  FETCH_ARGS=(env "HF_HUB_OFFLINE=${HF_OFFLINE}"
    python3 -m sparkserve fetch --launcher "${LAUNCHER}" --prog "${PROG}")
}

# fetch_models: download what the cache lacks before vLLM starts (sparkserve fetch); a
# failure is one line and exit 4, and nothing starts.
fetch_models() {
  fetch_command
  "${FETCH_ARGS[@]}" || exit 4
}

# guard_command: the memory guard's command line, into GUARD_ARGS. It watches this PID,
# which becomes vLLM's at the exec in start_vllm.
guard_command() {
  GUARD_ARGS=(python3 -m sparkserve.guard --pid "$$" --floor-gb "${GUARD_FLOOR_GB}"
    --os-reserve-gb "${OS_RESERVE_GB}" --swap-mb-s "${GUARD_SWAP_MB_S}"
    --psi-full-pct "${GUARD_PSI_PCT}" --textfile-dir "${GUARD_METRICS_DIR}"
    --marker "${GUARD_MARKER}")
}

# start_guard: the memory guard, in the background, next to the vLLM we are about to become.
start_guard() {
  [[ "${GUARD}" == 1 ]] || return 0
  guard_command
  "${GUARD_ARGS[@]}" </dev/null >&2 &
}

# watch_command: the pair watch's command line, into WATCH_ARGS. Like the guard it watches
# this PID (vLLM's after the exec) and stops it when either node of the pair fails.
watch_command() {
  local api="" address="${HOST}"
  if [[ "${address}" == 0.0.0.0 ]]; then
    address=127.0.0.1
  fi
  if [[ "${CLUSTER_RANK}" == 0 ]]; then
    api="http://${address}:${PORT}"
  fi
  WATCH_ARGS=(python3 -m sparkserve.cluster.watch --pid "$$" --rank "${CLUSTER_RANK}"
    --head-addr "${CLUSTER_HEAD_ADDR}" --host-ip "${CLUSTER_HOST_IP}"
    --port "${CLUSTER_WATCH_PORT}" --peer-timeout-s "${CLUSTER_PEER_TIMEOUT_S}"
    --join-timeout-s "${CLUSTER_JOIN_TIMEOUT_S}" --state-file "${CLUSTER_STATE_FILE}"
    --api-url "${api}")
}

# start_pair_watch: with CLUSTER_NODES=2, start the pair watch in the background and wait
# until the two nodes have joined; if the watch gives up first (peer unreachable, refused,
# join timeout), it has said why in one line and we exit with its status.
start_pair_watch() {
  [[ "${CLUSTER_NODES}" == 2 ]] || return 0
  local watch_pid status
  watch_command
  rm -f -- "${CLUSTER_STATE_FILE}"
  mkdir -p -- "$(dirname -- "${CLUSTER_STATE_FILE}")"
  "${WATCH_ARGS[@]}" </dev/null >&2 &
  watch_pid=$!
  until grep -qs '"state":"joined"' "${CLUSTER_STATE_FILE}"; do
    if ! kill -0 "${watch_pid}" 2>/dev/null; then
      status=0
      wait "${watch_pid}" || status=$?
      exit $(( status == 0 ? 1 : status ))
    fi
    sleep 0.2
  done
}

# start_vllm: exec vLLM in this process, so `docker stop` (SIGTERM) reaches it directly.
start_vllm() {
  export_vllm_env
  if [[ "${DRY_RUN}" == 1 ]]; then
    print_dry_run
    exit 0
  fi
  check_guard_record
  fetch_models
  printf '%s: starting vLLM %s: %s on %s:%s (GPU_MEM %s of %s GiB, prefix cache %s)\n' \
    "${PROG}" "${VLLM_FOUND_VERSION}" "${MODEL}" "${HOST}" "${PORT}" "${GPU_MEM}" \
    "${MEM_TOTAL_GIB}" "${PREFIX_CACHE}" >&2
  start_guard
  start_pair_watch
  exec vllm serve "${VLLM_ARGS[@]}"
}
