# shellcheck shell=bash
# Cached virtualenvs for the test command: each is built once per content key (its lock,
# pip's own lock, the Python version and the installer's own text) and reused while that key
# holds. A venv only counts once its ".complete" stamp is written, so a build that died
# half-way is thrown away, never reused. Every venv installs from a hash lock
# (requirements/*.lock, written by scripts/lock.sh) with --no-deps: nothing unlisted enters,
# and the build fails when the venv differs from its lock. Source this file; it defines
# functions only.

SPARKSERVE_LOCKS_PY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/locks.py"
SPARKSERVE_REQUIREMENTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../requirements" && pwd)"

sparkserve_cache_dir() {
  printf '%s\n' "${SPARKSERVE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/sparkserve}"
}

log() {
  printf '[test] %s\n' "$*" >&2
}

# content_key FILE... : a short hash of the files' bytes and the interpreter's version
content_key() {
  local python="$1"
  shift
  {
    "${python}" -c 'import sys; print(sys.version)'
    cat "$@"
  } | sha256sum | cut -c1-16
}

# ensure_venv NAME PYTHON INSTALL_FN KEY_FILE... : prints the venv's path.
# INSTALL_FN is called as `INSTALL_FN VENV_DIR` into a fresh venv when none is current.
ensure_venv() {
  local name="$1" python="$2" install_fn="$3"
  shift 3
  local cache key dir started
  cache="$(sparkserve_cache_dir)"
  key="$(content_key "${python}" "${SPARKSERVE_REQUIREMENTS}/bootstrap.lock" "$@")"
  dir="${cache}/venv-${name}-${key}"
  if [[ -f "${dir}/.complete" ]]; then
    touch "${dir}/.complete" # marks it in use, so another key's build keeps it
    log "venv ${name}: reusing ${dir}"
    printf '%s\n' "${dir}"
    return 0
  fi
  mkdir -p "${cache}"
  # One builder at a time per venv name; a second caller waits, then reuses the result.
  local lock_fd
  exec {lock_fd}>"${cache}/venv-${name}.lock"
  flock "${lock_fd}"
  if [[ -f "${dir}/.complete" ]]; then
    exec {lock_fd}>&-
    printf '%s\n' "${dir}"
    return 0
  fi
  # Venvs are not relocatable, so build in place. Other keys of this venv are dropped once
  # unused for a day: another checkout (a branch with other pins) may be running on one now,
  # and a half-built one is dead (its builder would hold the lock we hold).
  rm -rf "${dir}"
  local other
  for other in "${cache}/venv-${name}-"*; do
    [[ -d "${other}" ]] || continue
    if [[ ! -f "${other}/.complete" ]] || [[ -n "$(find "${other}/.complete" -mmin +1440)" ]]; then
      rm -rf "${other}"
    fi
  done
  log "venv ${name}: building ${dir} (first run on this machine or pins changed)"
  started=${SECONDS}
  "${python}" -m venv "${dir}"
  "${dir}/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --require-hashes -r "${SPARKSERVE_REQUIREMENTS}/bootstrap.lock" >&2
  "${install_fn}" "${dir}" >&2
  touch "${dir}/.complete"
  exec {lock_fd}>&-
  log "venv ${name}: built in $((SECONDS - started)) s"
  printf '%s\n' "${dir}"
}

# install_lock VENV NAME: requirements/NAME.lock into VENV, exactly: pip's --no-deps and
# --require-hashes, then the venv module's own setuptools removed unless the lock pins it.
install_lock() {
  local venv="$1" name="$2" lock="${SPARKSERVE_REQUIREMENTS}/$2.lock"
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --require-hashes -r "${lock}"
  if ! grep -q '^setuptools==' "${lock}"; then
    "${venv}/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y setuptools
  fi
}

# verify_lock VENV NAME [DIST==VERSION...]: fail unless VENV holds exactly NAME's lock, pip's
# own lock and the listed distributions that the project installs itself.
verify_lock() {
  local venv="$1" name="$2"
  shift 2
  python3 "${SPARKSERVE_LOCKS_PY}" verify "${name}" "${venv}/bin/python" "$@"
}
