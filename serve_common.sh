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
  local launcher="$1" exports
  if ! exports="$(python3 -m sparkserve knobs resolve --launcher "${launcher}" --prog "${PROG}")"; then
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
  if [[ "${PREFIX_CACHE}" == 1 ]]; then
    VLLM_ARGS+=(--enable-prefix-caching)
    if [[ "${WORKAROUND_MAMBA_ALIGN_FLAG}" == 1 ]]; then
      printf '%s: vLLM %s: %s\n' "${PROG}" "${VLLM_FOUND_VERSION}" \
        "${WORKAROUND_MAMBA_ALIGN_FLAG_REASON}" >&2
      VLLM_ARGS+=(--mamba-cache-mode align)
    fi
  else
    VLLM_ARGS+=(--no-enable-prefix-caching)
  fi
  if [[ -n "${TOOL_PARSER}" ]]; then
    VLLM_ARGS+=(--enable-auto-tool-choice --tool-call-parser "${TOOL_PARSER}")
  fi
  if [[ -n "${REASONING_PARSER}" ]]; then
    VLLM_ARGS+=(--reasoning-parser "${REASONING_PARSER}")
  fi
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
  export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS SPARK_KEEP_BF16_LMHEAD
  # The key goes through the environment so that it never shows in `ps` or in logs.
  if [[ -n "${API_KEY:-}" ]]; then
    export VLLM_API_KEY="${API_KEY}"
  fi
  unset API_KEY
}

# print_dry_run: the exact environment and command, secrets hidden, for DRY_RUN=1.
print_dry_run() {
  local name
  printf '%s: dry run (vLLM %s found); nothing started\n' "${PROG}" "${VLLM_FOUND_VERSION}"
  for name in HF_HOME VLLM_CACHE_ROOT VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS \
    SPARK_KEEP_BF16_LMHEAD; do
    printf 'env: %s=%s\n' "${name}" "${!name@Q}"
  done
  for name in VLLM_API_KEY HF_TOKEN; do
    if [[ -n "${!name:-}" ]]; then
      printf 'env: %s=<hidden>\n' "${name}"
    fi
  done
  if [[ "${GUARD}" == 1 ]]; then
    guard_command
    printf 'guard: %s\n' "${GUARD_ARGS[*]@Q}"
  fi
  printf 'exec: vllm serve %s\n' "${VLLM_ARGS[*]@Q}"
}

# check_guard_record: after the memory guard stopped vLLM it leaves a record on the model-cache
# volume; refuse to start (exit 3, so compose's on-failure:3 gives up) until GUARD_RESUME=1.
check_guard_record() {
  local record="${HF_HOME}/sparkserve/guard-stopped.json"
  [[ -f "${record}" ]] || return 0
  if [[ "${GUARD_RESUME}" == 1 ]]; then
    printf '%s: GUARD_RESUME=1: clearing the memory guard record %s and starting\n' \
      "${PROG}" "${record}" >&2
    rm -f -- "${record}"
    return 0
  fi
  printf '%s: the memory guard stopped vLLM last time (%s): %s; fix the cause (docs/MEMORY.md), then start once with GUARD_RESUME=1\n' \
    "${PROG}" "${record}" "$(tr -d '\n' < "${record}")" >&2
  exit 3
}

# guard_command: the memory guard's command line, into GUARD_ARGS. It watches this PID,
# which becomes vLLM's at the exec in start_vllm.
guard_command() {
  GUARD_ARGS=(python3 -m sparkserve.guard --pid "$$" --floor-gb "${GUARD_FLOOR_GB}"
    --os-reserve-gb "${OS_RESERVE_GB}" --swap-mb-s "${GUARD_SWAP_MB_S}"
    --psi-full-pct "${GUARD_PSI_PCT}" --textfile-dir "${HF_HOME}/sparkserve/metrics"
    --marker "${HF_HOME}/sparkserve/guard-stopped.json")
}

# start_guard: the memory guard, in the background, next to the vLLM we are about to become.
start_guard() {
  [[ "${GUARD}" == 1 ]] || return 0
  guard_command
  "${GUARD_ARGS[@]}" </dev/null >&2 &
}

# start_vllm: exec vLLM in this process, so `docker stop` (SIGTERM) reaches it directly.
start_vllm() {
  export_vllm_env
  if [[ "${DRY_RUN}" == 1 ]]; then
    print_dry_run
    exit 0
  fi
  check_guard_record
  printf '%s: starting vLLM %s: %s on %s:%s (GPU_MEM %s of %s GiB, prefix cache %s)\n' \
    "${PROG}" "${VLLM_FOUND_VERSION}" "${MODEL}" "${HOST}" "${PORT}" "${GPU_MEM}" \
    "${MEM_TOTAL_GIB}" "${PREFIX_CACHE}" >&2
  start_guard
  exec vllm serve "${VLLM_ARGS[@]}"
}
