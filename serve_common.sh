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

# start_step LAUNCHER: the start's one step into Python (sparkserve.start.cli): every knob
# resolved (registry < image < launcher < recipe < what you set; docs/KNOBS.md) and checked, with
# the memory budget, against this machine; the memory guard's record; the checkpoints put into
# the cache; vLLM's command built. It sets what this shell runs: VLLM_ARGS and VLLM_ENV (vLLM's
# command and environment; no argv for a dry run, which it printed), GUARD_ARGS and WATCH_ARGS
# (the guard's and the pair watch's commands, which watch this shell's PID, vLLM's parent:
# run_vllm), CLUSTER_STATE_FILE and BANNER. A refusal is its one line, through refuse, with the
# step's status: 2 a setting, 3 the guard's record, 4 a checkpoint. The key never reaches this
# shell's variables: Python reads it from the environment and puts it into VLLM_ENV only.
start_step() {
  local out status=0 line
  out="$(mktemp)"
  python3 -m sparkserve start --launcher "$1" --prog "${PROG}" --pid "$$" --records "${out}" \
    || status=$?
  if (( status != 0 )); then
    line="$(cat -- "${out}")"
    rm -f -- "${out}"
    # nothing written: Python itself failed, and said why above
    [[ -n "${line}" ]] || exit "${status}"
    refuse "${status}" "${line}"
  fi
  set_variables "${out}"
  rm -f -- "${out}"
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

# refuse STATUS LINE: exit STATUS (2: a setting, 3: a guard record, 4: a checkpoint) after
# printing LINE, once per container. Docker's restart policy restarts a refusing container with its growing delay
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
  # 1. Everything a start decides, in one step (DRY_RUN=1 and strict end there: nothing starts).
  start_step "$1"
  (( ${#VLLM_ARGS[@]} > 0 )) || exit 0
  printf '%s\n' "${BANNER}" >&2
  # 2. The guard and (on a pair) the pair watch beside it, then vLLM as this shell's child.
  # No secret knob reaches vLLM's environment; the key reaches vLLM only as VLLM_API_KEY
  # (VLLM_ENV), never on its command line.
  pass_stops_to_vllm
  start_guard
  start_pair_watch
  unset "${SECRET_KNOBS[@]}"
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
