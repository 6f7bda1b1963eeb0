"""The planner's in-memory patches (sparkserve.memory.patched_vllm) on the release under
test: the patched function is in vLLM's module only while the block runs, compiled from the
patch's own output of the installed file, and a name that is no patch is refused."""

from __future__ import annotations

import pytest

from sparkserve.memory.patched_vllm import PatchNotPlannable, patched
from sparkserve.patching import PAGE_DIVIDE

pytestmark = pytest.mark.release


def test_the_patched_function_is_in_place_only_inside_the_block() -> None:
    planning = pytest.importorskip("vllm.v1.core.kv_cache_planning")
    original = planning.unify_kv_cache_spec_page_size
    with patched((PAGE_DIVIDE.info.name,)) as notes:
        inside = planning.unify_kv_cache_spec_page_size
        assert inside is not original
        assert "_divided" in inside.__code__.co_varnames  # the patch's added lines
        assert inside.__code__.co_filename == planning.__file__
        assert notes == ["hybrid-page-divide: applied in this plan (the installed vLLM is "
                         "unpatched)"]  # fmt: skip
    assert planning.unify_kv_cache_spec_page_size is original


def test_a_name_that_is_no_patch_is_refused_and_nothing_changes() -> None:
    planning = pytest.importorskip("vllm.v1.core.kv_cache_planning")
    original = planning.unify_kv_cache_spec_page_size
    refused = pytest.raises(PatchNotPlannable, match="patch 'no-such': must be one of")
    with refused, patched((PAGE_DIVIDE.info.name, "no-such")):
        pass
    assert planning.unify_kv_cache_spec_page_size is original
