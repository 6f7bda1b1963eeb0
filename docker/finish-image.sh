#!/usr/bin/env bash
# finish-image.sh: the steps both image targets share once their vLLM is installed: this
# package (the vLLM general plugin, the knob registry, the tools) and the build-time patches.
# Each patch applies, finds vLLM already fixed, or stops the build on code it does not
# recognise (exit 3); --check then proves the installed vLLM needs nothing more.
set -euo pipefail

main() {
  cd /opt/sparkserve
  pip install --no-deps --no-build-isolation .
  sparkserve --version
  ./apply-vllm-patches.sh python
  # Built files only; the sources stay for `pip show` and tracebacks.
  rm -rf build ./*.egg-info src/*.egg-info
  non_root_home
}

# non_root_home: what the services need to run as a user that is not root (compose's `user:`,
# CACHE_UID:CACHE_GID, 1000:1000 by default). HOME (vLLM's config, any cache a start writes
# there), HF_HOME (the mount point: a new named volume takes its owner and mode) and the state
# folder are owned by 1000 and open to any user id (sticky, as /tmp), so a CACHE_UID other
# than 1000 works too. USER and LOGNAME (the Dockerfile's ENV) name the user for a uid with no
# passwd entry (getpass, torch's /tmp/torchinductor_<user>).
non_root_home() {
  if ! getent passwd 1000 >/dev/null; then  # Ubuntu's images have theirs (ubuntu)
    useradd --uid 1000 --user-group --no-create-home --home-dir "${HOME}" \
      --shell /usr/sbin/nologin sparkserve
  fi
  mkdir -p -- "${HF_HOME}" "${HOME}/.config" "${SPARKSERVE_STATE_DIR}"
  chown -R 1000:1000 -- "${HOME}" "${SPARKSERVE_STATE_DIR}"
  chmod 1777 -- "${HOME}" "${HOME}/.cache" "${HOME}/.config" "${HF_HOME}" \
    "${SPARKSERVE_STATE_DIR}"
}

main "$@"
