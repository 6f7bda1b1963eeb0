# shellcheck shell=bash
# The venv of olah, the Hugging Face mirror the download-fault tests fetch from
# (tests/fetch/test_fetch_faults.py): requirements/test-hub-mirror.lock, exactly.
# Apart from the core venv on purpose: the client under test is the core venv's
# huggingface_hub (the image's pin), and olah's own pins never touch that venv's key.
# Needs scripts/lib/venv.sh sourced. Source this file; it defines functions only.

install_hub_mirror_venv() {
  install_lock "$1" test-hub-mirror
  verify_lock "$1" test-hub-mirror
}
