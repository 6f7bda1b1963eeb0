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

# resolve_knobs LAUNCHER: every knob resolved (registry < image < launcher < recipe < what
# you set; docs/KNOBS.md) and checked, with the memory budget, against this machine. On a bad
# value the registry prints one line (knob, value, what is allowed) and we exit 2.
resolve_knobs() {
  local exports
  LAUNCHER="$1"
  if ! exports="$(python3 -m sparkserve knobs resolve --launcher "${LAUNCHER}" --prog "${PROG}")"; then
    exit 2
  fi
  eval "${exports}"
}

# vllm_command: vLLM's whole command line and environment, decided in one place
# (src/sparkserve/vllm_command.py) from the settings and the target's own config.json, into
# VLLM_ARGS and VLLM_ENV; the guard's and the pair watch's commands watch this PID, which
# becomes vLLM's at the exec in start_vllm.
vllm_command() {
  local exports
  if ! exports="$(python3 -m sparkserve knobs command --launcher "${LAUNCHER}" --prog "${PROG}" \
    --pid "$$")"; then
    exit 2
  fi
  eval "${exports}"
  local note
  for note in "${NOTES[@]}"; do
    printf '%s: %s\n' "${PROG}" "${note}" >&2
  done
}

# print_dry_run: the exact environment and commands, secrets hidden, for DRY_RUN=1.
print_dry_run() {
  local line
  printf '%s: dry run (vLLM %s found); nothing started\n' "${PROG}" "${VLLM_FOUND_VERSION}"
  for line in "${VLLM_ENV_SHOWN[@]}"; do
    printf 'env: %s\n' "${line}"
  done
  printf 'fetch: %s\n' "${FETCH_ARGS[*]@Q}"
  if (( ${#GUARD_ARGS[@]} > 0 )); then
    printf 'guard: %s\n' "${GUARD_ARGS[*]@Q}"
  fi
  if (( ${#WATCH_ARGS[@]} > 0 )); then
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

# fetch_models: download what the cache lacks before vLLM starts (sparkserve fetch); a
# failure is one line and exit 4, and nothing starts.
fetch_models() {
  "${FETCH_ARGS[@]}" || exit 4
}

# start_guard: the memory guard, in the background, next to the vLLM we are about to become;
# its keeper (sparkserve.guard_keeper) runs it and replaces it if it dies while vLLM runs.
start_guard() {
  (( ${#GUARD_ARGS[@]} > 0 )) || return 0
  "${GUARD_ARGS[@]}" </dev/null >&2 &
}

# start_pair_watch: on a pair, start the pair watch in the background and wait until the two
# nodes have joined; if the watch gives up first (peer unreachable, refused, join timeout), it
# has said why in one line and we exit with its status.
start_pair_watch() {
  (( ${#WATCH_ARGS[@]} > 0 )) || return 0
  local watch_pid status
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

# serve LAUNCHER: the launchers' whole run, step by step.
serve() {
  # 1. Every knob resolved and checked, the memory budget against this machine.
  resolve_knobs "$1"
  if [[ "${DRY_RUN}" == 1 ]]; then
    vllm_command
    print_dry_run
    exit 0
  fi
  # 2. Refuse after a memory guard stop; put the checkpoints into the cache.
  check_guard_record
  fetch_models
  # 3. vLLM's command, now that the target's config.json is at hand (hybrid or not).
  vllm_command
  printf '%s: starting vLLM %s: %s on %s:%s (GPU_MEM %s of %s GiB, prefix cache %s)\n' \
    "${PROG}" "${VLLM_FOUND_VERSION}" "${MODEL}" "${HOST}" "${PORT}" "${GPU_MEM}" \
    "${MEM_TOTAL_GIB}" "${PREFIX_CACHE}" >&2
  # 4. The guard and (on a pair) the pair watch beside it, then exec vLLM in this process,
  # so that `docker stop` (SIGTERM) reaches it directly. The key reaches vLLM only as
  # VLLM_API_KEY (VLLM_ENV), never on its command line.
  start_guard
  start_pair_watch
  unset API_KEY
  export "${VLLM_ENV[@]}"
  exec vllm serve "${VLLM_ARGS[@]}"
}
