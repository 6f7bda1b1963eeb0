# shellcheck shell=bash
# install_api_fuzz_venv VENV_DIR: schemathesis (requirements/test-api-fuzz.lock, exactly) into
# an already created venv; the caller keys its cache on that lock and this file.
# Needs scripts/lib/venv.sh sourced. Meant to be sourced.

install_api_fuzz_venv() {
  install_lock "${1:?usage: install_api_fuzz_venv VENV_DIR}" test-api-fuzz
  verify_lock "$1" test-api-fuzz
}
