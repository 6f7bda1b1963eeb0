"""One import check of the image's Python stack, run by scripts/check_aarch64_stack.sh inside
the arm64 chroot (emulated Python 3.11). Prints one JSON object as its last line; exits 1 when
the check fails.

  aarch64_probe.py torch | vllm | api_server | extensions
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path


def check_torch() -> dict[str, object]:
    import torch

    return {
        "torch": importlib.metadata.version("torch"),
        "torch_build": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }


def check_vllm() -> dict[str, object]:
    import vllm

    return {"vllm": importlib.metadata.version("vllm"), "vllm_build": vllm.__version__}


def check_api_server() -> dict[str, object]:
    module = importlib.import_module("vllm.entrypoints.openai.api_server")
    return {"module": module.__name__, "has_run_server": hasattr(module, "run_server")}


def load_extension(path: Path, package_root: Path) -> str:
    """Import PATH as the extension module its place names; a shared library that is not a
    Python module is loaded with dlopen. Both resolve every symbol now (RTLD_NOW)."""
    dotted = ".".join(path.relative_to(package_root).with_suffix("").parts)
    dotted = dotted.split(".abi3")[0].split(".cpython-")[0]
    try:
        importlib.import_module(dotted)
        return "import"
    except ImportError as error:
        if "module export function" not in str(error):
            raise
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return "dlopen"


def check_extensions() -> dict[str, object]:
    import torch  # noqa: F401  (the extensions link against libtorch, loaded by torch first)
    import vllm

    root = Path(vllm.__file__).parent
    found = sorted(root.rglob("*.so"))
    loaded: dict[str, str] = {}
    failed: dict[str, str] = {}
    for path in found:
        name = str(path.relative_to(root.parent))
        try:
            loaded[name] = load_extension(path, root.parent)
        except Exception as error:  # each failure is reported, not raised
            failed[name] = f"{type(error).__name__}: {error}"
    if not found:
        failed["(none)"] = f"no *.so under {root}"
    return {"loaded": loaded, "failed": failed}


CHECKS = {
    "torch": check_torch,
    "vllm": check_vllm,
    "api_server": check_api_server,
    "extensions": check_extensions,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: aarch64_probe.py {{{'|'.join(CHECKS)}}}", file=sys.stderr)
        return 2
    started = time.monotonic()
    result: dict[str, object] = {
        "check": argv[0],
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    try:
        result.update(CHECKS[argv[0]]())
        ok = not result.get("failed")
    except Exception:  # the report carries the traceback
        result["error"] = traceback.format_exc(limit=8)
        ok = False
    # Pins replaced for the emulated Python: say whether this check imported any of them.
    substituted = [n for n in os.environ.get("SPARKSERVE_SUBSTITUTED", "").split(",") if n]
    result["substituted_imported"] = [n for n in substituted if n in sys.modules]
    result["ok"] = ok
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
