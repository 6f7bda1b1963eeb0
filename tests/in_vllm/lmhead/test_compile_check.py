"""The lm-head kernels compile, without a GPU, with the Triton the image ships, for the Spark
(sm_121) and for the H200 of the benchmarks (sm_90a): every configuration the dispatch uses,
with tensor-core instructions in it and shared memory within the target's per-block limit.

A Triton release can rename what a kernel calls (Gluon's ``thread_barrier`` became ``barrier``
in 3.7, which the image's 3.8 lacks) and a table tuned on an H200 can ask for more shared memory
than a GB10 block has; both showed up here, not on a GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkserve.in_vllm.lmhead import compile_check, int8_kernel

REPO = Path(__file__).resolve().parents[3]


def _pin(path: Path) -> str:
    pinned = re.search(r"^triton==(\S+)", path.read_text(), re.MULTILINE)
    assert pinned, f"{path.name} pins no triton"
    return pinned.group(1)


IMAGE_TRITON = _pin(REPO / "requirements" / "spark-aarch64.lock")


def test_the_test_venv_pins_the_images_triton() -> None:
    assert _pin(REPO / "requirements" / "test-core.lock") == IMAGE_TRITON


def _skip_reason() -> str | None:
    try:
        import triton
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError:
        return "Triton with its NVIDIA backend is not installed"
    if triton.__version__ != IMAGE_TRITON:  # the test venv pins it; other setups differ
        return f"the image ships Triton {IMAGE_TRITON}, this is {triton.__version__}"
    return None


needs_image_triton = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@needs_image_triton
@pytest.mark.parametrize("arch", compile_check.ARCHS)
def test_every_dispatched_kernel_compiles(arch: int) -> None:
    results = compile_check.compile_all(arch)
    assert {c.m for c in results} == set(compile_check.MS)
    for c in results:
        where = f"sm_{arch} {c.kernel} M={c.m}"
        assert compile_check.uses_tensor_cores(c), f"{where}: no tensor-core instruction"
        assert c.fits, f"{where}: {c.shared_bytes} B of shared memory"
    kinds = {c.kernel for c in results}
    assert kinds == ({"wgmma", "triton"} if arch == 90 else {"gluon", "triton"})


@needs_image_triton
def test_the_spark_drops_a_stage_where_the_h200_table_does_not_fit() -> None:
    # the 17-32-row entry was tuned with four stages (104 KiB); a GB10 block holds 99 KiB
    table = int8_kernel.select_config(26)
    (c,) = [c for c in compile_check.compile_all(121) if c.m == 26]
    assert (table.num_stages, c.stages) == (4, 3)


def test_cli_checks_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_check.main(["--k", "100"]) == 2
    assert "--k 100 is not a positive multiple of 256" in capsys.readouterr().err
    assert compile_check.main(["--n", "0"]) == 2
    with pytest.raises(SystemExit):
        compile_check.main(["--arch", "75"])
