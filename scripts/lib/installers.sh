# shellcheck shell=bash
# What goes into each cached test venv. The venv key hashes this file, so editing an
# installer rebuilds its venv. Needs REPO and the versions.env variables in scope.

install_core_venv() {
  local venv="$1"
  local pip=("${venv}/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" -r "${REPO}/requirements/test-core.txt"
  "${pip[@]}" --no-deps "vllm==${VLLM_VERSION}" -r "${REPO}/requirements/test-core-nodeps.txt"
}

# ensure_vllm_source VERSION : prints a directory holding that release's `vllm` package,
# Python sources only (the compiled extensions are not needed to import its config and
# KV-cache classes on a CPU). Cached like the venvs.
ensure_vllm_source() {
  local version="$1" cache dir wheels
  cache="$(sparkserve_cache_dir)"
  dir="${cache}/vllm-src-${version}"
  if [[ -f "${dir}/.complete" ]]; then
    printf '%s\n' "${dir}"
    return 0
  fi
  rm -rf "${dir}"
  mkdir -p "${dir}"
  wheels="$(mktemp -d)"
  log "vllm ${version}: downloading the wheel for its sources"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.12 --implementation cp \
    -d "${wheels}" "vllm==${version}" >&2
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
