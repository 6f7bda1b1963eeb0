#!/usr/bin/env python3
"""Make vLLM's prefix-cache hash-block back-off align-aware (see docs/PATCHES.md).

Run at image build time against the installed vLLM; safe to run again. Exit status:
0 applied / already applied / fixed upstream (or reverted), 1 needed (--check only),
2 bad arguments, 3 unrecognised code (nothing changed), 4 read or write error.
"""

import sys
from pathlib import Path

try:
    from sparkserve.patching import PREFIX_ALIGN
    from sparkserve.patching.cli import run
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))
    from sparkserve.patching import PREFIX_ALIGN
    from sparkserve.patching.cli import run

if __name__ == "__main__":
    sys.exit(run(PREFIX_ALIGN, sys.argv[1:], prog="patch_prefix_align.py"))
