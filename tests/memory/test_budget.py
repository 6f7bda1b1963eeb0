"""The GPU_MEM budget rule: the launcher's refusal, plan's "largest GPU_MEM" and doctor's budget
row are one predicate, so they agree on both sides of every boundary."""

from __future__ import annotations

import pytest

from sparkserve.knobs.registry import KnobError
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.start_parts import checked_settings
from sparkserve.memory.budget import budget_problem, largest_gpu_mem, leaves_reserve
from sparkserve.memory.host import GIB

# (total GiB, OS_RESERVE_GB): a Spark, a round machine where the boundary is a hundredth
# exactly, this 24 GiB test machine, and a reserve no GPU_MEM in range keeps.
CASES = [(119.7, 14.0), (100.0, 18.0), (23.5, 4.0), (119.7, 64.0), (256.0, 4.0)]


@pytest.mark.parametrize(("total_gib", "reserve"), CASES)
def test_largest_is_the_last_hundredth_that_keeps_the_reserve(
    total_gib: float, reserve: float
) -> None:
    total = int(total_gib * GIB)
    largest = largest_gpu_mem(reserve, total)
    assert 0.0 <= largest <= 0.95
    if largest > 0:
        assert leaves_reserve(largest, reserve, total)
        assert budget_problem(round(largest, 2), reserve, total) is None
    above = round(largest + 0.01, 2)
    if above <= 0.95:
        assert not leaves_reserve(above, reserve, total)
        problem = budget_problem(above, reserve, total)
        assert problem is not None
        assert f"the largest GPU_MEM that keeps it is {largest:.2f}" in problem


def test_an_exact_hundredth_boundary_is_kept() -> None:
    # 100 GiB less 18 GiB is GPU_MEM 0.82 to the byte: allowed, and the largest.
    assert largest_gpu_mem(18.0, 100 * GIB) == 0.82
    assert budget_problem(0.82, 18.0, 100 * GIB) is None
    assert budget_problem(0.83, 18.0, 100 * GIB) is not None


@pytest.mark.parametrize(("total_gib", "reserve"), CASES)
def test_the_launcher_refuses_exactly_above_the_largest(total_gib: float, reserve: float) -> None:
    total = int(total_gib * GIB)
    largest = largest_gpu_mem(reserve, total)
    env = {"OS_RESERVE_GB": str(reserve) if reserve >= 4 else "4", "SPARKSERVE_IMAGE": "spark"}
    if largest >= 0.1:
        checked_settings({**env, "GPU_MEM": f"{largest:.2f}"}, "dflash", total)  # no error
    above = round(largest + 0.01, 2)
    if 0.1 <= above <= 0.95:
        with pytest.raises(KnobError, match=f"keeps it is {largest:.2f}"):
            checked_settings({**env, "GPU_MEM": f"{above:.2f}"}, "dflash", total)


def test_doctor_uses_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkserve.doctor import cli as doctor
    from sparkserve.memory.host import MemInfo

    total = 100 * GIB  # a stand-in machine: the boundary at 0.82 is exact
    fake = MemInfo(total=total, available=total, used=0, swap_total=0, swap_used=0)
    monkeypatch.setattr(doctor, "read_meminfo", lambda: fake)
    for gpu_mem, status in (("0.82", "ok"), ("0.83", "blocker")):
        settings = resolve_settings({"GPU_MEM": gpu_mem, "OS_RESERVE_GB": "18"})
        rows = doctor.check_memory(settings, spark=True)
        budget = next(row for row in rows if row.name == "memory budget")
        assert budget.status == status, budget
