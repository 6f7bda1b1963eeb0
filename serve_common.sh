# shellcheck shell=bash
# Shared steps of serve.sh and mtp_serve.sh; sourced, defines functions only. The launcher
# sets PROG (its own name, for messages) before sourcing this file.
: "${PROG:?the launcher sets PROG before sourcing serve_common.sh}"
# The knobs themselves (names, defaults, allowed values, why) live in one registry:
# src/sparkserve/knobs/registry.py. Nothing here starts vLLM until every knob has passed it.

# refuse_arguments ARGS...: settings come from the environment only, so that compose, docs
# and validation see every one of them; a stray argument is a mistake, not an option. The one
# word taken is `selftest` (the image's entrypoint is this launcher, so `docker compose run
# --rm --no-deps sparkserve selftest [OPTIONS]` arrives here): it runs `sparkserve selftest`.
refuse_arguments() {
  if [[ "${1:-}" == selftest ]]; then
    shift
    exec python3 -m sparkserve selftest "$@"
  fi
  if (( $# > 0 )); then
    printf '%s: takes no arguments (got %q); set knobs in the environment, e.g. EXTRA_ARGS\n' \
      "${PROG}" "$1" >&2
    exit 2
  fi
}

# resolve_knobs LAUNCHER: every knob resolved (registry < image < launcher < recipe < what
# you set; docs/KNOBS.md) and checked, with the memory budget, against this machine, and the
# start decided: the fetch's, the guard's and the pair watch's commands (they watch this
# shell's PID, vLLM's parent: run_vllm) and LAUNCH_PLAN, what vllm_command reads. On a bad
# value the registry prints one line (knob, value, what is allowed) and we exit 2.
resolve_knobs() {
  python_step knobs resolve --launcher "$1" --prog "${PROG}" --pid "$$"
}

# python_step ARGS...: `python3 -m sparkserve ARGS` (with this function's standard input),
# whose output sets this shell's variables (set_variables); on failure its one line goes
# through refuse and the launcher exits 2.
python_step() {
  local said out status=0 line
  said="$(mktemp)"
  out="$(mktemp)"
  python3 -m sparkserve "$@" >"${out}" 2>"${said}" || status=$?
  if (( status != 0 )); then
    line="$(cat -- "${said}")"
    rm -f -- "${said}" "${out}"
    refuse 2 "${line}"
  fi
  cat -- "${said}" >&2
  set_variables "${out}"
  rm -f -- "${said}" "${out}"
}

# set_variables FILE: the variables a Python step wrote to FILE (sparkserve.launch.shell.records:
# `scalar NAME VALUE` or `array NAME COUNT WORD...`, every field ended by a NUL) as this
# shell's globals. Read as data, never run: no value can execute anything here.
set_variables() {
  local -a fields
  local i=0 kind name count
  mapfile -t -d '' fields < "$1"
  while (( i < ${#fields[@]} )); do
    kind="${fields[i]}"
    name="${fields[i + 1]:-}"
    count="${fields[i + 2]:-}"
    if [[ ! "${name}" =~ ^[A-Z][A-Z0-9_]*$ ]] \
      || [[ "${kind}" == array && ! "${count}" =~ ^(0|[1-9][0-9]*)$ ]] \
      || (( i + 3 > ${#fields[@]} )); then
      printf '%s: unreadable output of a sparkserve step at field %s (%q %q)\n' \
        "${PROG}" "${i}" "${kind}" "${name}" >&2
      exit 1
    fi
    case "${kind}" in
      scalar)
        printf -v "${name}" '%s' "${fields[i + 2]}"
        i=$(( i + 3 ))
        ;;
      array)
        if (( i + 3 + count > ${#fields[@]} )); then
          printf '%s: unreadable output of a sparkserve step: %s has fewer than %s words\n' \
            "${PROG}" "${name}" "${count}" >&2
          exit 1
        fi
        local -n words="${name}"
        # shellcheck disable=SC2034  # a nameref: this sets the global array NAME
        words=("${fields[@]:i + 3:count}")
        unset -n words
        i=$(( i + 3 + count ))
        ;;
      *)
        printf '%s: unreadable output of a sparkserve step: record kind %q\n' \
          "${PROG}" "${kind}" >&2
        exit 1
        ;;
    esac
  done
}

# refuse STATUS LINE: exit STATUS (2: a setting, 3: a guard record) after printing LINE, once
# per container. Docker's restart policy restarts a refusing container with its growing delay
# (up to one start a minute) on the same filesystem, so a later start that would say the same
# line says nothing: `docker compose logs` shows the reason once and `docker compose ps` the
# status. A new container (after `up` with a changed setting) says it again. Only as a
# container's main process (PID 1, or the child of `init: true`'s docker-init) with the image's
# SPARKSERVE_STATE_DIR; anywhere else every refusal prints.
refuse() {
  local status="$1" line="$2" said
  if [[ -z "${SPARKSERVE_STATE_DIR:-}" ]] || (( $$ != 1 && PPID != 1 )); then
    printf '%s\n' "${line}" >&2
    exit "${status}"
  fi
  said="${SPARKSERVE_STATE_DIR}/refused"
  if [[ "$(cat -- "${said}" 2>/dev/null || true)" != "${status} ${line}" ]]; then
    printf '%s\n' "${line}" >&2
    mkdir -p -- "${SPARKSERVE_STATE_DIR}"
    printf '%s %s' "${status}" "${line}" > "${said}"
  fi
  exit "${status}"
}

# vllm_command: vLLM's whole command line and environment, decided in one place
# (src/sparkserve/launch/vllm_command.py) from the launch plan resolve_knobs made and the
# target's own config.json, into VLLM_ARGS and VLLM_ENV. The plan holds the key: it goes to
# Python on a pipe, never into an argument or the environment.
vllm_command() {
  python_step knobs command --prog "${PROG}" <<< "${LAUNCH_PLAN}"
  unset LAUNCH_PLAN
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

# check_guard_record [look]: after the memory guard stopped vLLM it leaves a record on the
# model-cache volume; refuse to start (exit 3, at once: no model load, no memory taken) until a
# container created with GUARD_RESUME=1 starts. Only that container's first start may clear a
# record: it leaves a mark in the container's own filesystem (SPARKSERVE_STATE_DIR), so a
# restart of the same container, with the same environment, never clears a record written
# later. `look` (the strict dry run) refuses alike and changes nothing: a new container with
# GUARD_RESUME=1 would clear the record, so that passes.
check_guard_record() {
  local record="${GUARD_MARKER}" mode="${1:-start}"
  local spent="${SPARKSERVE_STATE_DIR:-${TMPDIR:-/tmp}}/guard-resume-spent"
  if [[ "${GUARD_RESUME}" == 1 && ! -e "${spent}" ]]; then
    [[ "${mode}" == look ]] && return 0
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
  local line
  if [[ "${GUARD_RESUME}" == 1 ]]; then
    printf -v line '%s: the memory guard stopped vLLM (%s): %s; GUARD_RESUME=1 was spent on this container'"'"'s first start: fix the cause (docs/MEMORY.md), then recreate the container (docker compose up -d --force-recreate)' \
      "${PROG}" "${record}" "$(tr -d '\n' < "${record}")"
    refuse 3 "${line}"
  fi
  printf -v line '%s: the memory guard stopped vLLM last time (%s): %s; fix the cause (docs/MEMORY.md), then start once with GUARD_RESUME=1' \
    "${PROG}" "${record}" "$(tr -d '\n' < "${record}")"
  refuse 3 "${line}"
}

# fetch_models: download what the cache lacks before vLLM starts (sparkserve fetch, which
# reads the launch plan on a pipe: the checkpoints of these settings); a failure is one line
# and exit 4, and nothing starts.
fetch_models() {
  "${FETCH_ARGS[@]}" <<< "${LAUNCH_PLAN}" || exit 4
}

# check_models: the strict dry run's fetch: every refusal the fetch would make (the checkpoints
# whole in the cache, or on the Hub with the token and room on the disk), nothing downloaded.
check_models() {
  "${FETCH_ARGS[@]}" --check <<< "${LAUNCH_PLAN}" || exit 4
}

# start_guard: the memory guard, in the background, next to the vLLM we are about to become;
# its keeper (sparkserve.guard.keeper) runs it and replaces it if it dies while vLLM runs.
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
  # DRY_RUN=strict: the start's own steps up to serving, each refusing as a start does, and
  # nothing changed (scripts/up.sh runs it before Compose touches the running server).
  if [[ "${DRY_RUN}" == strict ]]; then
    check_guard_record look
    check_models
    vllm_command
    print_dry_run
    printf '%s: strict dry run: a start with these settings passes every check on this machine\n' \
      "${PROG}" >&2
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
  # 4. The guard and (on a pair) the pair watch beside it, then vLLM as this shell's child.
  # The key reaches vLLM only as VLLM_API_KEY (VLLM_ENV), never on its command line.
  pass_stops_to_vllm
  start_guard
  start_pair_watch
  unset API_KEY
  export "${VLLM_ENV[@]}"
  run_vllm
}

# pass_stops_to_vllm: from here on SIGTERM and SIGINT are a stop asked for (STOP_ASKED), passed
# on to vLLM as SIGTERM once it runs (a background child of a non-interactive shell ignores
# SIGINT). Set before the guard starts: a guard that trips at once stops us through it.
pass_stops_to_vllm() {
  STOP_ASKED=0
  VLLM_PID=""
  trap 'STOP_ASKED=$((STOP_ASKED + 1)); [[ -z "${VLLM_PID}" ]] ||
    kill -TERM "${VLLM_PID}" 2>/dev/null || true' TERM INT
}

# run_vllm: vLLM as this shell's child, stops passed on to it (pass_stops_to_vllm: `docker
# stop`'s SIGTERM reaches this shell through `init: true`; the guard and the pair watch stop
# vLLM by stopping this shell), and its status as ours, with one rule: vLLM is a server and
# never ends by itself with success. vLLM 0.32's API server exits 0 when its engine core dies
# (a crash in the engine, the engine process killed); that ends as exit 1 here, so that the
# container's exit says it failed. A stop that was asked for ends with vLLM's own status.
run_vllm() {
  local status=0 asked
  (( STOP_ASKED == 0 )) || exit 0  # stopped before vLLM started
  vllm serve "${VLLM_ARGS[@]}" &
  VLLM_PID=$!
  (( STOP_ASKED == 0 )) || kill -TERM "${VLLM_PID}"  # a stop between the two lines above
  # A trapped signal makes `wait` return at once (the trap runs right after): wait again, for
  # vLLM's own status. Not when vLLM is gone: a signal that lands as vLLM dies can make bash
  # (5.2) reap it and lose its status, and a second `wait` would then block until the guard's
  # keeper, our other child, exits (a stop's SIGTERM unanswered; tests/launch/test_serve_common.py).
  while :; do
    asked=${STOP_ASKED}
    status=0
    wait "${VLLM_PID}" || status=$?
    (( STOP_ASKED != asked )) || break
    kill -0 "${VLLM_PID}" 2>/dev/null || break
  done
  if (( STOP_ASKED == 0 )); then
    if (( status == 0 )); then
      printf '%s: vLLM ended by itself with status 0: its engine died (see above); exit 1\n' \
        "${PROG}" >&2
      exit 1
    fi
    printf '%s: vLLM ended by itself with status %s\n' "${PROG}" "${status}" >&2
  fi
  exit "${status}"
}
