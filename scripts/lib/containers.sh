# shellcheck shell=bash
# Image building for the end-to-end container test: podman + buildah (Debian), a Debian base
# image made with debootstrap (no registry here), and the `cpu` target of the Dockerfile built
# with this machine's pip settings passed in (never baked in). Docker runs the containers
# (scripts/lib/docker_engine.sh); podman only builds. Each step is skipped while its
# result exists and its inputs are unchanged. Needs root and scripts/lib/venv.sh sourced first
# (for `log` and `sparkserve_cache_dir`). Source this file; it defines functions only.

CONTAINER_TOOLS=(podman buildah runc debootstrap uidmap)
BASE_SUITE="bookworm"
BASE_MIRROR="http://deb.debian.org/debian"

# ensure_container_tools REPO: install podman & co. when missing; point podman's builds at the
# settings these machines need (scripts/lib/podman-containers.conf explains them).
ensure_container_tools() {
  local repo="$1" tool missing=()
  for tool in podman buildah runc debootstrap; do
    command -v "${tool}" >/dev/null 2>&1 || missing+=("${tool}")
  done
  if ((${#missing[@]} > 0)); then
    log "containers: installing ${CONTAINER_TOOLS[*]} (missing: ${missing[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${CONTAINER_TOOLS[@]}" >&2
  fi
  export CONTAINERS_CONF="${repo}/scripts/lib/podman-containers.conf"
}

# base_image_key: a hash of what makes the base image, so a changed recipe rebuilds it.
base_image_key() {
  { declare -f build_base_image; printf '%s %s\n' "${BASE_SUITE}" "${BASE_MIRROR}"; } \
    | sha256sum | cut -c1-16
}

# build_base_image TAG KEY: a minimal Debian rootfs, imported as an image (no registry needed).
build_base_image() {
  local tag="$1" key="$2" rootfs
  rootfs="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: the path is fixed
  trap "rm -rf '${rootfs}'" RETURN
  debootstrap --variant=minbase "${BASE_SUITE}" "${rootfs}" "${BASE_MIRROR}" >&2
  rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/*
  tar -C "${rootfs}" -c . | podman import \
    --change 'CMD ["/bin/bash"]' --change "LABEL sparkserve.base-key=${key}" - "${tag}" >&2
}

# ensure_base_image TAG: prints TAG once the image exists with the current recipe's key.
ensure_base_image() {
  local tag="$1" key have started
  key="$(base_image_key)"
  have="$(podman image inspect --format '{{index .Labels "sparkserve.base-key"}}' "${tag}" \
    2>/dev/null || true)"
  if [[ "${have}" != "${key}" ]]; then
    log "containers: building the base image ${tag} (debootstrap ${BASE_SUITE})"
    started=${SECONDS}
    build_base_image "${tag}" "${key}"
    log "containers: base image built in $((SECONDS - started)) s"
  fi
  printf '%s\n' "${tag}"
}

# pip_setting NAME: this machine's pip setting NAME (find-links, extra-index-url, cert, ...),
# from its config files or PIP_* environment, as `pip config list` shows it; empty if unset.
pip_setting() {
  python3 -m pip config list 2>/dev/null \
    | sed -n "s/^[^=]*\.$1='\(.*\)'\$/\1/p" | tail -n 1
}

# host_pip_build_flags: `podman build` flags that hand this machine's pip settings (local
# wheel folders, extra indexes, the CA bundle of an intercepting proxy) to RUN steps as
# build args and read-only volumes. Prints one flag per line; nothing when pip has none.
host_pip_build_flags() {
  local find_links extra cert path
  find_links="$(pip_setting find-links)"
  extra="$(pip_setting extra-index-url)"
  cert="$(pip_setting cert)"
  for path in ${find_links} ${extra}; do
    path="${path#file://}"
    path="${path%/simple}"
    if [[ "${path}" == /* && -d "${path}" ]]; then
      printf -- '--volume=%s:%s:ro\n' "${path}" "${path}"
    fi
  done
  [[ -z "${find_links}" ]] || printf -- '--build-arg=PIP_FIND_LINKS=%s\n' "${find_links}"
  [[ -z "${extra}" ]] || printf -- '--build-arg=PIP_EXTRA_INDEX_URL=%s\n' "${extra}"
  if [[ -n "${cert}" && -f "${cert}" ]]; then
    printf -- '--volume=%s:/run/host-ca.crt:ro\n' "${cert}"
    printf -- '--build-arg=PIP_CERT=/run/host-ca.crt\n'
  fi
}

# ensure_cpu_image REPO TAG BASE: build (or, from podman's layer cache, reuse) the Dockerfile's
# `cpu` target on BASE. Prints TAG; a failed build returns 1. Checked by hand: this runs in a
# command substitution, where `set -e` does not reach, and TAG may still name an older build
# (the tag is per checkout path), which must never be tested in its place.
ensure_cpu_image() {
  local repo="$1" tag="$2" base="$3" started flags
  mapfile -t flags < <(host_pip_build_flags)
  log "containers: building ${tag} (Dockerfile target cpu; cached layers are reused)"
  started=${SECONDS}
  if ! podman build --format docker --network host --target cpu \
    --build-arg "CPU_BASE_IMAGE=${base}" "${flags[@]}" --tag "${tag}" "${repo}" >&2; then
    log "containers: building ${tag} failed (podman's last lines above); nothing is tested on it"
    return 1
  fi
  log "containers: ${tag} ready in $((SECONDS - started)) s"
  printf '%s\n' "${tag}"
}
