# shellcheck shell=bash
# Debian packages the tests run for real (not pip-installable): installed with apt when a
# command they provide is missing, so a clean CI machine gets them and a warm one skips apt.
# Source this file; it defines functions only. Needs `log` (scripts/lib/venv.sh).

# The metrics tests start Debian's Prometheus (with promtool) and node-exporter on loopback.
METRICS_DEBIAN_PACKAGES=(prometheus prometheus-node-exporter)
METRICS_COMMANDS=(prometheus promtool prometheus-node-exporter)

# ensure_debian_packages "CMD..." PACKAGE... : apt-get install PACKAGE... unless every CMD is on
# PATH. Waits for another apt/dpkg run to finish instead of failing on its lock.
ensure_debian_packages() {
  local commands="$1"
  shift
  local cmd missing=0
  for cmd in ${commands}; do
    command -v "${cmd}" >/dev/null 2>&1 || missing=1
  done
  ((missing)) || return 0
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 || {
      log "need root or sudo to apt-get install $*"
      return 1
    }
    sudo=(sudo)
  fi
  log "apt: installing $* (missing on this machine)"
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
  "${apt[@]}" update -qq >&2
  # policy-rc.d-less containers: the packages' services are not started (no init system);
  # the tests start their own instances on free loopback ports.
  "${apt[@]}" install -y -qq --no-install-recommends "$@" >&2
}

ensure_metrics_packages() {
  ensure_debian_packages "${METRICS_COMMANDS[*]}" "${METRICS_DEBIAN_PACKAGES[@]}"
}

# The pair's tests (tests/e2e/test_cluster_pair.py, tests/cluster/) make network namespaces
# joined by a veth pair with iproute2's `ip`.
ensure_netns_packages() {
  ensure_debian_packages "ip" iproute2
}

# The browser tests (tests/e2e/test_browser_access.py) drive Debian's headless Chromium through
# its chromedriver.
ensure_browser_packages() {
  ensure_debian_packages "chromium chromedriver" chromium chromium-driver
}
