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
}

main "$@"
