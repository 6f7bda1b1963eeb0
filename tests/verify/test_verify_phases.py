"""Which settings verify serves for what the server uses, and that it ends where it began."""

from __future__ import annotations

import pytest

from sparkserve.launch.settings import resolve_settings
from sparkserve.server.restarts import Restarter
from sparkserve.verify import phases
from sparkserve.verify.phases import TOUCHED, Phase, Uses
from support.recording_driver import Recording

ALL = set(phases.CHECKS)


def names(plan: list[Phase]) -> list[str]:
    return [p.name for p in plan]


def test_the_spark_default_serves_every_reference() -> None:
    uses = Uses.of(resolve_settings({}, "dflash"))
    assert uses == Uses(speculating=True, int8_head=True, prefix_cache=True)
    plan = phases.plan(uses, ALL)
    assert names(plan) == ["served", "prefix cache off", "bf16 head", "plain int8"]
    assert plan[2].changes == {"NUM_SPEC_TOKENS": "0", "SPARK_KEEP_BF16_LMHEAD": "1"}
    assert plan[3].changes == {"NUM_SPEC_TOKENS": "0"}


@pytest.mark.parametrize(
    ("uses", "checks", "expected"),
    [
        (Uses(False, True, True), ALL, ["served", "prefix cache off", "bf16 head", "plain int8"]),
        (Uses(True, False, False), ALL, ["served", "plain int8"]),
        (Uses(False, False, False), ALL, ["served"]),
        (Uses(True, True, True), {"api"}, ["served"]),
        (Uses(True, True, True), {"speculation"}, ["served", "plain int8"]),
    ],
)
def test_only_what_the_server_uses_is_checked(uses: Uses, checks: set[str],
                                              expected: list[str]) -> None:  # fmt: skip
    assert names(phases.plan(uses, checks)) == expected


def test_without_speculation_the_head_is_scored_on_the_starting_setting() -> None:
    plan = phases.plan(Uses(False, True, False), {"head"})
    assert plan[-1].name == "plain int8" and plan[-1].changes == {}


def test_each_restart_names_all_three_knobs_and_the_end_is_the_start() -> None:
    driver = Recording({"NUM_SPEC_TOKENS": "4", "OTHER": "x"})
    restarter = Restarter.of(driver, TOUCHED, 60, lambda _: None, "verify")
    for phase in phases.plan(Uses(True, True, True), ALL):
        restarter.serve(phase.changes, phase.why)
    restarter.restore()
    start = {"PREFIX_CACHE": None, "NUM_SPEC_TOKENS": "4", "SPARK_KEEP_BF16_LMHEAD": None}
    assert driver.restarts == [
        {**start, "PREFIX_CACHE": "0"},
        {**start, "NUM_SPEC_TOKENS": "0", "SPARK_KEEP_BF16_LMHEAD": "1"},
        {**start, "NUM_SPEC_TOKENS": "0"},
        start,
    ]
    assert restarter.took_s == [1.0, 1.0, 1.0]
    restarter.restore()  # already there: no restart
    assert len(driver.restarts) == 4


def test_the_first_line_counts_the_restarts_the_plan_costs() -> None:
    assert phases.restarts_line(phases.plan(Uses(True, True, True), ALL)) == (
        "3 restarts and one back"
    )
    assert phases.restarts_line(phases.plan(Uses(False, True, True), ALL)) == "3 restarts"
    assert phases.restarts_line(phases.plan(Uses(True, False, False), ALL)) == (
        "1 restart and one back"
    )
    assert phases.restarts_line(phases.plan(Uses(False, False, False), ALL)) == "0 restarts"
