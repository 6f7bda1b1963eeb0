# shellcheck shell=bash
# What stress_mem.sh and bench.sh share: where a sparkserve tool runs and where its results go.
#
# Where: inside the server container that `docker compose` runs from this checkout, with
# `docker compose exec`. The image has the tool and everything it needs (nothing to install on
# the host), and the container holds the settings the server was started with: the knobs
# compose passed from .env and, for those left out, the image's own defaults (the cpu image's
# OS_RESERVE_GB 4, not the Spark's 14). The container sees the host's /proc (memory, swap,
# pressure), nvidia-smi on a Spark, and the guard's record on the cache volume.
# The host's Python instead (PYTHON, default python3, with psutil; knobs from .env, then the
# registry's defaults) when --url names a server, when SPARKSERVE_SERVICE=host, or when no
# server service of this checkout runs.
# Results: --out, else $SPARKSERVE_RESULTS/<tool>-YYYYmmdd-HHMMSS, default results/ in the
# checkout (ignored by git).
# Needs REPO set; source this file, then `run_host_tool stress|bench|llama-benchy "$@"`.

# the compose services that serve the API, in the order they are looked for
HOST_TOOL_SERVICES=(sparkserve sparkserve-mtp sparkserve-head sparkserve-cpu)

host_tool_die() {
  printf '%s\n' "$*" >&2
  exit 2
}

# running_server_service: the first serving service of this checkout's compose project that
# runs now (COMPOSE_PROJECT_NAME, COMPOSE_FILE and the rest are honoured); none: empty.
running_server_service() {
  local running name
  running="$(docker compose --project-directory "${REPO}" ps --status running \
    --format '{{.Service}}' 2>/dev/null)" || return 0
  for name in "${HOST_TOOL_SERVICES[@]}"; do
    if grep -qxF "${name}" <<<"${running}"; then
      printf '%s\n' "${name}"
      return 0
    fi
  done
}

run_host_tool() {
  local tool="$1"
  shift
  local args=() out="" has_url=0 help=0
  while (($#)); do
    case "$1" in
      --out) out="${2-}"; shift 2 || shift ;;
      --out=*) out="${1#--out=}"; shift ;;
      --url | --url=*) has_url=1; args+=("$1"); shift ;;
      -h | --help) help=1; args+=("$1"); shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [[ -n "${out}" ]] || out="${SPARKSERVE_RESULTS:-${REPO}/results}/${tool}-$(date +%Y%m%d-%H%M%S)"

  local service="${SPARKSERVE_SERVICE:-}"
  if [[ -z "${service}" && "${has_url}" == 0 ]] && command -v docker >/dev/null 2>&1; then
    service="$(running_server_service)"
  fi
  if [[ -z "${service}" || "${service}" == host ]]; then
    run_on_host "${tool}" "${help}" --out "${out}" "${args[@]}"
  fi
  run_in_container "${tool}" "${service}" "${help}" "${out}" "${args[@]}"
}

run_on_host() {
  local tool="$1" help="$2"
  shift 2
  local python="${PYTHON:-python3}"
  # The checkout's own package when run from one; the installed package (the image) otherwise.
  if [[ -d "${REPO}/src/sparkserve" ]]; then
    export PYTHONPATH="${REPO}/src${PYTHONPATH:+:${PYTHONPATH}}"
  fi
  if [[ "${help}" == 0 ]] && ! "${python}" -c 'import psutil' 2>/dev/null; then
    host_tool_die "${tool}: no sparkserve server runs here under docker compose, and" \
      "${python} has no psutil: start the server (docker compose up -d), or set PYTHON to" \
      "a Python with sparkserve's dependencies"
  fi
  # Knobs (PORT, API_KEY, OS_RESERVE_GB, ...) from the checkout's .env, as compose reads them;
  # the environment and a later --env-file win.
  exec "${python}" -m sparkserve "${tool}" --env-file "${SPARKSERVE_ENV_FILE:-${REPO}/.env}" "$@"
}

run_in_container() {
  local tool="$1" service="$2" help="$3" out="$4"
  shift 4
  local compose=(docker compose --project-directory "${REPO}")
  local inside="/tmp/sparkserve-${tool}-$$" tty=(-T) rc=0 interrupted=0
  [[ -t 0 && -t 1 ]] && tty=()  # a terminal: Ctrl-C reaches the tool through it
  if [[ "${help}" == 1 ]]; then
    exec "${compose[@]}" exec "${tty[@]}" "${service}" sparkserve "${tool}" "$@"
  fi
  if [[ -e "${out}" && ! -d "${out}" ]]; then
    host_tool_die "bad --out '${out}': exists and is not a folder"
  fi
  printf '[%s] running in the %s container (its own settings); results to %s/\n' \
    "${tool}" "${service}" "${out}" >&2
  trap 'interrupted=1' INT
  "${compose[@]}" exec "${tty[@]}" "${service}" sparkserve "${tool}" --out "${inside}" "$@" \
    || rc=$?
  trap - INT
  # What the tool wrote (also after a failed or interrupted run), moved out in one exec.
  local archive
  archive="$(mktemp)"
  # shellcheck disable=SC2016 # expanded by the container's sh
  if "${compose[@]}" exec -T "${service}" sh -c \
    'test -d "$1" || exit 3; tar -C "$1" -cf - . && rm -rf "$1"' sh "${inside}" >"${archive}"; then
    mkdir -p "${out}"
    tar -C "${out}" -xf "${archive}" || host_tool_die "${tool}: could not unpack into ${out}"
    printf '[%s] results in %s/\n' "${tool}" "${out}" >&2
  fi
  rm -f "${archive}"
  ((interrupted == 0 || rc != 0)) || rc=130
  exit "${rc}"
}
