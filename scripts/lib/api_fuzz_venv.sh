# shellcheck shell=bash
# install_api_fuzz_venv VENV_DIR REPO_ROOT: schemathesis (requirements/test-api-fuzz.txt)
# into an already created, empty venv; the caller keys its cache on that file and this one.
# Meant to be sourced.

install_api_fuzz_venv() {
  local venv_dir="${1:?usage: install_api_fuzz_venv VENV_DIR REPO_ROOT}"
  local repo_root="${2:?usage: install_api_fuzz_venv VENV_DIR REPO_ROOT}"
  "${venv_dir}/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "${repo_root}/requirements/test-api-fuzz.txt"
}
