# shellcheck shell=bash
# What the suite's commands (scripts/test.sh, scripts/with_suite_docker.sh) share: the venvs
# and their installers, the container tools, the system packages, the suite's Docker Engine,
# and versions.env's pins exported. Sourced after REPO is set; defines functions and
# variables only.
: "${REPO:?set REPO (the checkout) before sourcing scripts/lib/suite.sh}"
# shellcheck source=scripts/lib/venv.sh
source "${REPO}/scripts/lib/venv.sh"
# shellcheck source=scripts/lib/installers.sh
source "${REPO}/scripts/lib/installers.sh"
# shellcheck source=scripts/lib/containers.sh
source "${REPO}/scripts/lib/containers.sh"
# shellcheck source=scripts/lib/system_packages.sh
source "${REPO}/scripts/lib/system_packages.sh"
# shellcheck source=scripts/lib/docker_engine.sh
source "${REPO}/scripts/lib/docker_engine.sh"
set -a
# shellcheck source=versions.env
source "${REPO}/versions.env"
set +a
