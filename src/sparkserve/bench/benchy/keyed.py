"""llama-benchy with the API key from its environment, never on a command line.

llama-benchy 0.4.0 takes the key only as `--api-key KEY` (llama_benchy/config.py), where `ps`
and /proc/PID/cmdline show it to every user of the machine. `sparkserve llama-benchy` runs this
module instead (`python -m sparkserve.bench.benchy.keyed ARGS`) with the key in KEY_ENV: the
option is added to sys.argv inside the process, which its command line never shows, and the
variable is removed before llama-benchy runs, so nothing it starts inherits it.
"""

from __future__ import annotations

import os
import runpy
import sys

KEY_ENV = "SPARKSERVE_BENCHY_API_KEY"


def main() -> None:
    key = os.environ.pop(KEY_ENV, "")
    sys.argv = [sys.argv[0], *sys.argv[1:], *(["--api-key", key] if key else [])]
    runpy.run_module("llama_benchy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
