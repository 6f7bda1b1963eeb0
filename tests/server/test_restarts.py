"""tune's and verify's Restarter: what each restart names, what it says, and the way back."""

from __future__ import annotations

from sparkserve.server.restarts import Restarter
from support.recording_driver import Recording


def test_a_restart_names_the_changes_and_the_way_back_names_the_start() -> None:
    driver = Recording({"KV_CACHE_GB": "8"})
    said: list[str] = []
    restarter = Restarter.of(driver, ["KV_CACHE_GB"], 60, said.append, "tune")
    assert restarter.running("KV_CACHE_GB") == "8"
    assert restarter.serve({"KV_CACHE_GB": "8"}, "candidate 1 of 2") == 0.0  # runs with it
    assert restarter.serve({"KV_CACHE_GB": "12"}, "candidate 2 of 2") == 1.0
    assert restarter.running("KV_CACHE_GB") == "12"
    restarter.restore()
    assert driver.restarts == [{"KV_CACHE_GB": "12"}, {"KV_CACHE_GB": "8"}]
    assert said == [
        "[tune] restarting with KV_CACHE_GB=12 (candidate 2 of 2)",
        "[tune] healthy with KV_CACHE_GB=12 after 1.0 s",
        "[tune] restoring the starting setting KV_CACHE_GB=8",
        "[tune] the server runs with KV_CACHE_GB=8 again",
    ]
    assert restarter.took_s == [1.0]


def test_a_knob_unset_at_the_start_is_unset_again_at_the_end() -> None:
    driver = Recording({"NUM_SPEC_TOKENS": "4"})
    said: list[str] = []
    restarter = Restarter.of(driver, ["NUM_SPEC_TOKENS", "PREFIX_CACHE"], 60, said.append, "v")
    restarter.serve({"PREFIX_CACHE": "0"}, "the reference")
    restarter.restore()
    assert driver.restarts[-1] == {"NUM_SPEC_TOKENS": "4", "PREFIX_CACHE": None}
    assert said[-1] == "[v] the server runs with NUM_SPEC_TOKENS=4 PREFIX_CACHE unset again"
    assert restarter.running("PREFIX_CACHE") is None
