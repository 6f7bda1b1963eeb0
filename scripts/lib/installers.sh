# shellcheck shell=bash
# What goes into each cached test venv: its lock (requirements/NAME.lock), exactly. The venv
# key hashes this file and the lock, so editing either rebuilds the venv. Needs REPO and the
# versions.env variables in scope, and scripts/lib/venv.sh sourced.

install_core_venv() {
  install_lock "$1" test-core
  verify_lock "$1" test-core
}

# ensure_vllm_source VERSION LOCK : prints a directory holding that release's `vllm` package,
# Python sources only (the compiled extensions are not needed to import its config, KV-cache
# and model-runner classes on a CPU). The wheel comes hash-checked from requirements/LOCK.lock
# (vllm-sources: the prefix-align bug's release; vllm-next-sources: the release on trial).
# Cached like the venvs.
ensure_vllm_source() {
  local version="$1" name="$2" cache dir wheels lock="${REPO}/requirements/$2.lock"
  cache="$(sparkserve_cache_dir)"
  dir="${cache}/vllm-src-${version}"
  if [[ -f "${dir}/.complete" ]]; then
    printf '%s\n' "${dir}"
    return 0
  fi
  grep -q "^vllm==${version} " "${lock}" || {
    log "vllm ${version}: requirements/${name}.lock pins another release; run scripts/lock.sh ${name}"
    return 1
  }
  rm -rf "${dir}"
  mkdir -p "${dir}"
  wheels="$(mktemp -d)"
  log "vllm ${version}: downloading the wheel for its sources"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes --platform manylinux_2_28_x86_64 --python-version 3.12 \
    --implementation cp -d "${wheels}" -r "${lock}" >&2
  python3 - "${wheels}" "${dir}" <<'PY'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("vllm-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    members = [m for m in archive.namelist() if not (m.endswith(".so") or ".so." in m)]
    archive.extractall(sys.argv[2], members)
PY
  rm -rf "${wheels}"
  touch "${dir}/.complete"
  printf '%s\n' "${dir}"
}
