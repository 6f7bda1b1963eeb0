"""What verify's settings and --checks claim, and the exit status when a claim was not tested:
a feature the settings turn off is not tested and claims nothing, unless --checks names it
(NUM_SPEC_TOKENS=0 with `--checks speculation`): then it is a claim not tested, exit 5, never
"passed"."""

from __future__ import annotations

from sparkserve import command_line as cl
from sparkserve.client.checks import exit_status, mark, untested_claims
from sparkserve.launch.settings import resolve_settings
from sparkserve.verify import cli, phases
from sparkserve.verify.phases import Uses

TIE, MAX_DELTA = 0.05, 0.1


def verdicts(uses: Uses, checks: set[str], named: frozenset[str]) -> list:
    got = cli.Collected(runs={phases.SERVED: {}})
    return cli._verdicts(got, uses, checks, MAX_DELTA, TIE, named)


def test_speculation_off_with_a_claim_of_it_is_not_tested_and_exits_5() -> None:
    uses = Uses.of(resolve_settings({"NUM_SPEC_TOKENS": "0", "PREFIX_CACHE": "0",
                                     "SPARK_KEEP_BF16_LMHEAD": "1"}, "dflash"))  # fmt: skip
    assert uses == Uses(speculating=False, int8_head=False, prefix_cache=False)
    found = verdicts(uses, {"speculation"}, frozenset({"speculation"}))
    ((setting, result),) = found
    assert (setting, result.name, mark(result.ok)) == ("served", "speculation vs plain",
                                                        "not tested")  # fmt: skip
    assert result.claimed
    assert result.detail == ("not tested: NUM_SPEC_TOKENS=0: the feature is off but --checks "
                             "names it")  # fmt: skip
    assert untested_claims(found) == ["served: speculation vs plain"]
    assert exit_status(r for _, r in found) == cl.EXIT_NOT_TESTED == 5


def test_features_the_settings_turn_off_claim_nothing_by_default() -> None:
    uses = Uses(speculating=False, int8_head=False, prefix_cache=False)
    found = verdicts(uses, set(phases.CHECKS), frozenset())
    assert [mark(r.ok) for _, r in found] == ["not tested"] * 3
    assert not any(r.claimed for _, r in found)
    assert exit_status(r for _, r in found) == cl.EXIT_OK
