"""Which ways of splitting the model the engine serves with each launcher's drafter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkserve.knobs.registry import KnobError

if TYPE_CHECKING:
    from sparkserve.launch.settings import Settings


def check_layout(settings: Settings) -> None:
    """KnobError when the pair's layout cannot serve this launcher's drafter.

    DFlash reads the target's hidden states from several layers, so with pipeline parallelism
    they would have to cross stages; vLLM 0.33's GPU model runner asks the model
    (`verify_supports_aux_hidden_states_over_pp`, v1/worker/gpu/spec_decode/eagle/
    eagle3_utils.py) and Qwen3.5's classes answer no (tests/plan/test_plan_pair.py shows it)."""
    if not settings.pair or settings.values.CLUSTER_LAYOUT != "pp":
        return
    if settings.launcher == "dflash" and settings.speculating:
        raise KnobError(
            "CLUSTER_LAYOUT='pp': vLLM does not serve the DFlash drafter across pipeline "
            "stages on Qwen3.5; use CLUSTER_LAYOUT=tp, mtp_serve.sh, or NUM_SPEC_TOKENS=0"
        )
