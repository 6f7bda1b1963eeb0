"""Which splits of the model each launcher's drafter allows (sparkserve.launch.cluster_layout): only
DFlash with a drafter across pipeline stages of a pair is refused, in one line."""

from __future__ import annotations

import pytest

from sparkserve.knobs.registry import KnobError, Launcher
from sparkserve.launch.cluster_layout import check_layout
from sparkserve.launch.settings import resolve_settings

PP_PAIR = {"CLUSTER_NODES": "2", "CLUSTER_LAYOUT": "pp"}


@pytest.mark.parametrize(
    ("values", "launcher"),
    [
        ({**PP_PAIR, "NUM_SPEC_TOKENS": "0"}, "dflash"),  # no drafter runs
        ({**PP_PAIR, "NUM_SPEC_TOKENS": "2"}, "mtp"),  # the MTP layer is the target's own
        ({**PP_PAIR, "CLUSTER_LAYOUT": "tp", "NUM_SPEC_TOKENS": "12"}, "dflash"),
        ({**PP_PAIR, "CLUSTER_NODES": "1", "NUM_SPEC_TOKENS": "12"}, "dflash"),  # no pair
        ({"NUM_SPEC_TOKENS": "12"}, "dflash"),
    ],
)  # fmt: skip
def test_layouts_that_serve_the_drafter_pass(values: dict[str, str], launcher: Launcher) -> None:
    check_layout(resolve_settings(values, launcher))


@pytest.mark.parametrize("tokens", ["1", "12"])
def test_dflash_with_a_drafter_across_pipeline_stages_is_refused(tokens: str) -> None:
    with pytest.raises(KnobError) as caught:
        check_layout(resolve_settings({**PP_PAIR, "NUM_SPEC_TOKENS": tokens}, "dflash"))
    assert str(caught.value) == (
        "CLUSTER_LAYOUT='pp': vLLM does not serve the DFlash drafter across pipeline "
        "stages on Qwen3.5; use CLUSTER_LAYOUT=tp, mtp_serve.sh, or NUM_SPEC_TOKENS=0"
    )
