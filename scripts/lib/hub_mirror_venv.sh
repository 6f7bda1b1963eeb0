# shellcheck shell=bash
# The venv of olah, the Hugging Face mirror the download-fault tests fetch from
# (tests/test_fetch_faults.py): its pinned closure, installed as it is, nothing resolved.
# Apart from the core venv on purpose: the client under test is the core venv's
# huggingface_hub (the image's pin), and olah's own pins never touch that venv's key.
# Needs REPO in scope. Source this file; it defines functions only.

install_hub_mirror_venv() {
  local venv="$1"
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    -r "${REPO}/requirements/test-hub-mirror.txt"
}
