"""Memory pressure-stall information (sparkserve.memory.pressure): the PSI file's parser and
its errors, the reader that gives None where the kernel has no PSI, and the stall share
between two readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.memory.pressure import (
    PSI_MEMORY,
    Pressure,
    StallRate,
    parse_pressure,
    read_pressure,
)

# The format of /proc/pressure/memory (Documentation/accounting/psi.rst).
PSI_TEXT = (
    "some avg10=12.50 avg60=3.00 avg300=1.00 total=4000000\n"
    "full avg10=7.25 avg60=1.00 avg300=0.50 total=1500000\n"
)


def totals(some_total_us: int, full_total_us: int) -> Pressure:
    return Pressure(0.0, 0.0, some_total_us, full_total_us)


def test_pressure_reader_and_stall_rate(tmp_path: Path) -> None:
    text = PSI_TEXT
    pressure = parse_pressure(text)
    assert (pressure.some_avg10, pressure.full_avg10, pressure.full_total_us) == (
        12.5,
        7.25,
        1500000,
    )
    with pytest.raises(ValueError, match="not a PSI file"):
        parse_pressure("some avg10=x total=1\n", "/proc/pressure/memory")
    stalls = StallRate()
    assert stalls.add(10.0, pressure) == (0.0, 0.0)
    later = parse_pressure(text.replace("total=4000000", "total=4500000"))
    assert stalls.add(11.0, later) == pytest.approx((0.5, 0.0))
    here = read_pressure()  # this machine's kernel: a real file or None, never an error
    (tmp_path / "memory").write_text("no pressure here\n")
    assert read_pressure(tmp_path / "memory") is None  # the guard keeps its other rules
    assert here is None or 0 <= here.full_avg10 <= 100


def test_every_field_is_read_and_blank_lines_or_loose_words_are_skipped() -> None:
    text = "\n" + PSI_TEXT.replace("avg300=1.00", "avg300=1.00 extra") + "\n"
    assert parse_pressure(text) == Pressure(12.5, 7.25, 4000000, 1500000)


def test_a_file_without_a_full_line_reads_full_as_zero() -> None:
    # A "some" line alone: the format of /proc/pressure/cpu before Linux 5.13.
    assert parse_pressure(PSI_TEXT.splitlines()[0]) == Pressure(12.5, 0.0, 4000000, 0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "full avg10=7.25 total=1500000\n",  # no "some" line
        "some avg10=12.50 avg60=3.00\n",  # no total
        "some avg10=12.50 total=1.5\n",  # total is whole microseconds
        "some avg10=12.50 total=4000000\nfull avg10=7.25\n",  # a "full" line without its total
        "MemTotal: 8388608 kB\n",  # another /proc file
    ],
)
def test_anything_else_is_a_one_line_error_naming_the_file(text: str) -> None:
    with pytest.raises(ValueError, match=r"^/tmp/psi: not a PSI file \(.+\)$") as error:
        parse_pressure(text, "/tmp/psi")
    assert "\n" not in str(error.value)


def test_the_error_names_the_kernel_file_by_default() -> None:
    with pytest.raises(ValueError, match=f"^{PSI_MEMORY}: not a PSI file"):
        parse_pressure("")


def test_reader_reads_a_file_in_the_kernel_format(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    path.write_text(PSI_TEXT)
    assert read_pressure(path) == Pressure(12.5, 7.25, 4000000, 1500000)


def test_reader_gives_none_where_there_is_no_file_to_read(tmp_path: Path) -> None:
    assert read_pressure(tmp_path / "absent") is None  # a kernel without PSI
    assert read_pressure(tmp_path) is None  # not a file


def test_this_kernels_psi_file_parses_when_it_has_one() -> None:
    if not PSI_MEMORY.exists():
        pytest.skip(f"{PSI_MEMORY}: this kernel has no PSI")
    here = read_pressure()
    assert here is not None
    assert 0 <= here.full_avg10 <= here.some_avg10 <= 100
    assert 0 <= here.full_total_us <= here.some_total_us


def test_stall_shares_of_some_and_full_over_the_interval() -> None:
    stalls = StallRate()
    stalls.add(5.0, totals(1_000_000, 400_000))
    assert stalls.add(5.5, totals(1_300_000, 500_000)) == pytest.approx((0.6, 0.2))
    assert stalls.add(6.5, totals(1_300_000, 500_000)) == (0.0, 0.0)  # no stall this second


def test_a_reading_at_the_same_or_an_earlier_time_gives_zero_and_becomes_the_base() -> None:
    stalls = StallRate()
    stalls.add(5.0, totals(0, 0))
    assert stalls.add(5.0, totals(900_000, 900_000)) == (0.0, 0.0)
    assert stalls.add(4.0, totals(1_000_000, 1_000_000)) == (0.0, 0.0)
    # Measured from the last reading (4.0 s, 1 s stalled), not from the first.
    assert stalls.add(6.0, totals(1_500_000, 1_200_000)) == pytest.approx((0.25, 0.1))


def test_stall_shares_are_kept_within_0_and_1() -> None:
    stalls = StallRate()
    stalls.add(0.0, totals(5_000_000, 5_000_000))
    assert stalls.add(1.0, totals(1_000_000, 1_000_000)) == (0.0, 0.0)  # totals went back
    assert stalls.add(2.0, totals(3_500_000, 1_000_000)) == (1.0, 0.0)  # 2.5 s in 1 s
