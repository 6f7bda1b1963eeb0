#!/usr/bin/env bash
# up.sh: `docker compose up -d` for a changed setting, with every refusal a start would make run
# first, by the launcher itself (DRY_RUN=strict), in a throwaway container of each service
# (`compose run --rm --no-deps`: the service's image, environment, volumes and network, nothing
# started beside it): the knobs' ranges, the memory budget and the recipe's fit on this machine,
# the memory guard's record, and the checkpoints (whole in the cache, or on the Hub with the
# token and room on the disk; nothing is downloaded). A refusal touches no running container,
# exits with the launcher's status (2 a setting, 3 the guard's record, 4 a checkpoint) and ends
# with its one line. Compose itself cannot do this: a plain `up -d` recreates (stops) the
# running server before its *-fetch service or the new server can refuse (docs/FINDINGS.md,
# "Docker: crash, reboot, refusal, stop, drain").
# Usage: scripts/up.sh [--profile P] [-p NAME] [-f FILE] [--env-file FILE] [SERVICE...]
#   (default SERVICE: sparkserve; Compose's own COMPOSE_* variables apply as to `docker compose`)
set -euo pipefail

readonly PROG="up.sh"
readonly VALUE_OPTIONS=" -p --project-name -f --file --profile --env-file --project-directory "

compose_options=()
while (( $# > 0 )) && [[ "$1" == -* ]]; do
  if [[ "$1" == *=* && "${VALUE_OPTIONS}" == *" ${1%%=*} "* ]]; then
    compose_options+=("$1")
    shift
  elif [[ "${VALUE_OPTIONS}" == *" $1 "* && $# -ge 2 ]]; then
    compose_options+=("$1" "$2")
    shift 2
  else
    echo "${PROG}: $1: not a docker compose option it passes on:${VALUE_OPTIONS% } (each with a value)" >&2
    exit 2
  fi
done
services=("$@")
(( ${#services[@]} > 0 )) || services=(sparkserve)
compose=(docker compose "${compose_options[@]}")

# launchers_line OUTPUT [PATTERN]: from what `compose run` printed, the launcher's last line
# that matches PATTERN (default: any of its lines), else the last line. Compose copies the
# container's stdout and stderr separately, so their lines can interleave out of order, and its
# own container lines may come last.
launchers_line() {
  awk -v want="${2:-}" 'NF { last = $0 } /^(serve|mtp_serve)\.sh: / && $0 ~ want { mine = $0 }
       END { print (mine != "" ? mine : last) }' <<<"$1"
}

for service in "${services[@]}"; do
  printf '%s: %s: checking the start (DRY_RUN=strict, a container of its own)\n' \
    "${PROG}" "${service}" >&2
  status=0
  said="$("${compose[@]}" run --rm --no-deps -e DRY_RUN=strict "${service}" 2>&1)" || status=$?
  if (( status != 0 )); then
    printf '%s: %s: refused, nothing running was touched (exit %s); the launcher said:\n' \
      "${PROG}" "${service}" "${status}" >&2
    launchers_line "${said}" >&2
    exit "${status}"
  fi
  launchers_line "${said}" 'strict dry run: ' >&2  # that every check passed
done
exec "${compose[@]}" up -d "${services[@]}"
