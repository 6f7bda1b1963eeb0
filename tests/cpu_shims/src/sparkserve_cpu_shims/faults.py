"""Deliberate faults for the tests of `sparkserve verify`: the gate must catch each. Chosen by
SPARKSERVE_TEST_FAULT (comma-separated) in the test server's environment; absent, nothing here
runs. Test-only, like the rest of this plugin: never in an image.

- ``head-scale-shift``: once sparkserve's int8 lm-head is built, its row scales move down by
  one row (row i is scaled by row i-1's scale): a broken head that still answers.
- ``accept-all-drafts``: the greedy rejection sampler sees every drafted token as the
  target's choice, so every draft is accepted: a speculation that is fast and lossy.
- ``bf16-head``: sparkserve's int8 lm-head plugin keeps the bf16 head, as its calibration
  may off CUDA, though SPARK_KEEP_BF16_LMHEAD=0 asks for int8: no int8 head runs.
- ``no-drafts``: the scheduler drops every draft the drafter hands it, so no draft is
  proposed to the target, though speculation is configured.

The last two switch a feature off behind its settings (docs/FINDINGS.md, "verify with a feature
switched off behind its settings"): verify must call each "not tested", never passed.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sparkserve_cpu_shims._hooks import after_import, log

ENV = "SPARKSERVE_TEST_FAULT"
FAULTS = ("head-scale-shift", "accept-all-drafts", "bf16-head", "no-drafts")


def chosen() -> set[str]:
    names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
    unknown = names - set(FAULTS)
    if unknown:
        raise ValueError(f"{ENV}: unknown fault(s) {sorted(unknown)}; one of {FAULTS}")
    return names


def _shift_scales(module: ModuleType) -> None:
    original: Callable[..., Any] = module.convert_model

    @functools.wraps(original)
    def convert_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        report = original(model, *args, **kwargs)
        head = getattr(model, "lm_head", None)
        scale = getattr(head, "int8_scale", None)
        if scale is not None:
            with torch.no_grad():
                scale.copy_(torch.roll(scale.clone(), 1, dims=0))
            log.warning("fault head-scale-shift: the int8 head's row scales moved by one row")
        return report

    module.convert_model = convert_model


def _accept_all(module: ModuleType) -> None:
    original: Callable[..., Any] = module.rejection_sample

    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids: Any, num_draft_tokens: Any, max_spec_len: Any, cu_num_draft_tokens: Any,
        draft_probs: Any, target_logits: Any, *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        import torch

        logits = target_logits.clone()
        if draft_token_ids.numel():  # a step may draft nothing (warm-up, a first token)
            rows = torch.arange(draft_token_ids.shape[0], device=logits.device)
            logits[rows, draft_token_ids.long()] = logits.max() + 1.0
        return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                        draft_probs, logits, *args, **kwargs)  # fmt: skip

    module.rejection_sample = rejection_sample
    log.warning("fault accept-all-drafts: every drafted token is accepted")


def _keep_bf16(module: ModuleType) -> None:
    original: Callable[..., Any] = module.convert_model

    @functools.wraps(original)
    def convert_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        log.warning("fault bf16-head: the int8 head is not built")
        return module.HeadReport(path="bf16", reason="fault bf16-head")

    module.convert_model = convert_model


def _drop_drafts(module: ModuleType) -> None:
    scheduler = module.Scheduler
    original: Callable[..., Any] = scheduler.update_draft_token_ids

    @functools.wraps(original)
    def update_draft_token_ids(self: Any, draft_token_ids: Any) -> None:
        for req_id in draft_token_ids.req_ids:  # as if the drafter had proposed nothing
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids:
                request.spec_token_ids = []

    scheduler.update_draft_token_ids = update_draft_token_ids
    log.warning("fault no-drafts: the scheduler drops every draft")


def install() -> None:
    faults = chosen()
    if "head-scale-shift" in faults:
        after_import("sparkserve.in_vllm.lmhead.plugin", _shift_scales)
    if "accept-all-drafts" in faults:
        after_import("vllm.v1.sample.rejection_sampler", _accept_all)
    if "bf16-head" in faults:
        after_import("sparkserve.in_vllm.lmhead.plugin", _keep_bf16)
    if "no-drafts" in faults:
        after_import("vllm.v1.core.sched.scheduler", _drop_drafts)
