"""vLLM general plugin for benchmarks/gpu/spec_cost.py alone: how many drafted tokens the
target accepts, set per step from a switch file while the server runs, so that one server
measures a speculative step at every acceptance.

spec_cost.py copies this file into its work folder as the module `sparkserve_spec_accept`
beside a dist-info that names it a `vllm.general_plugins` entry point, and puts that folder
(and tests/cpu_shims/src, whose accept-all-drafts fault it reuses) on PYTHONPATH of the
servers it starts itself, with SPARKSERVE_SPEC_COST_ACCEPT naming the switch file. Nothing
else installs it: never in an image, never on the serve path.

The switch file holds:
- nothing (or no file): vLLM's own rejection sampling, untouched;
- ``all``: every draft is the target's choice: tests/cpu_shims' ``accept-all-drafts`` fault
  on vLLM's V1 model runner (the CPU's); on Model Runner V2 (vLLM 0.33's default on CUDA for
  DFlash and MTP, with its own sampler the fault does not reach) the same bias with no limit;
- an integer k: the first k drafts of each request's step are the target's choice and the
  rest are not, so every step accepts exactly min(k, drafts) and yields that many + 1 tokens.

It biases the target's logits before greedy rejection sampling, as the fault does; the tokens
served are not the model's (a benchmark of cost, never of output). Both runners' samplers are
wrapped; whichever runs, its wrapper logs once on its first step.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ENV = "SPARKSERVE_SPEC_COST_ACCEPT"
SAMPLER = "vllm.v1.sample.rejection_sampler"  # the V1 model runner's
SAMPLER_V2 = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"  # Model Runner V2's
log = logging.getLogger("vllm.sparkserve_spec_accept")

_registered = False


def register() -> None:
    """Entry point for ``vllm.general_plugins``: nothing unless ENV names a switch file."""
    global _registered
    switch = os.environ.get(ENV, "")
    if _registered or not switch:
        return
    _registered = True
    from sparkserve_cpu_shims._hooks import after_import

    after_import(SAMPLER, functools.partial(install, Path(switch)))
    after_import(SAMPLER_V2, functools.partial(install_v2, Path(switch)))


def mode(switch: Path) -> str:
    try:
        return switch.read_text().strip()
    except FileNotFoundError:
        return ""


def first_k(draft_token_ids: Any, cu_num_draft_tokens: Any, target_logits: Any, k: int) -> Any:
    """Target logits under which greedy rejection accepts exactly the first k drafts of each
    request: the draft's logit raised above every other at positions < k, lowered below every
    other at the rest. All on the logits' device (no host sync)."""
    import torch

    if not draft_token_ids.numel():  # a step may draft nothing (warm-up, a first token)
        return target_logits
    logits = target_logits.clone()
    cu = cu_num_draft_tokens.to(logits.device)
    rows = torch.arange(draft_token_ids.shape[0], device=logits.device, dtype=cu.dtype)
    request = torch.searchsorted(cu, rows, right=True)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    position = rows - starts[request]
    high, low = logits.max() + 1.0, logits.min() - 1.0
    logits[rows.long(), draft_token_ids.long()] = torch.where(position < k, high, low)
    return logits


def first_k_v2(
    target_logits: Any, draft_sampled: Any, expanded_local_pos: Any, k: int
) -> Any:  # fmt: skip
    """Model Runner V2's layout: a request's logits rows are its positions 0..drafts, and row
    i is checked against the token of row i + 1 (draft_sampled, -1 for none). The same bias
    as first_k: row i favours that draft where its position is < k, disfavours it elsewhere."""
    import torch

    if target_logits.shape[0] < 2:
        return target_logits
    logits = target_logits.clone()
    position = expanded_local_pos
    following = draft_sampled[1:].long()
    checked = (position[1:] == position[:-1] + 1) & (following >= 0)
    rows = torch.arange(logits.shape[0] - 1, device=logits.device)
    columns = torch.where(checked, following, torch.zeros_like(following))
    high, low = logits.max() + 1.0, logits.min() - 1.0
    wanted = torch.where(position[:-1] < k, high, low)
    logits[rows, columns] = torch.where(checked, wanted, logits[rows, columns])
    return logits


def announce(runner: str, switch: Path) -> Callable[[], None]:
    said = []

    def once() -> None:
        if not said:
            said.append(True)
            log.warning("spec_cost: %s sampler: drafts accepted as %s says", runner, switch)

    return once


def install_v2(switch: Path, module: ModuleType) -> None:
    own: Callable[..., Any] = module.rejection_sample
    first_step = announce("Model Runner V2", switch)

    @functools.wraps(own)
    def rejection_sample(
        target_logits: Any, draft_logits: Any, draft_sampled: Any, cu_num_logits: Any,
        pos: Any, idx_mapping: Any, expanded_idx_mapping: Any, expanded_local_pos: Any,
        *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        first_step()
        chosen = mode(switch)
        if chosen == "all" or chosen.isdigit():
            k = target_logits.shape[0] if chosen == "all" else int(chosen)
            target_logits = first_k_v2(target_logits, draft_sampled, expanded_local_pos, k)
        return own(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                   expanded_idx_mapping, expanded_local_pos, *args, **kwargs)  # fmt: skip

    module.rejection_sample = rejection_sample


def install(switch: Path, module: ModuleType) -> None:
    from sparkserve_cpu_shims import faults

    own: Callable[..., Any] = module.rejection_sample
    first_step = announce("V1 model runner", switch)

    @functools.cache
    def every() -> Callable[..., Any]:
        """The tests' fault over vLLM's sampler, as SPARKSERVE_TEST_FAULT installs it (it
        logs that it is on), made when `all` is first asked for."""
        holder = SimpleNamespace(rejection_sample=own)
        faults._accept_all(holder)  # type: ignore[arg-type]
        return holder.rejection_sample

    @functools.wraps(own)
    def rejection_sample(
        draft_token_ids: Any, num_draft_tokens: Any, max_spec_len: Any, cu_num_draft_tokens: Any,
        draft_probs: Any, target_logits: Any, *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        first_step()
        chosen = mode(switch)
        if chosen == "all":
            sample = every()
        else:
            sample = own
            if chosen.isdigit():
                target_logits = first_k(
                    draft_token_ids, cu_num_draft_tokens, target_logits, int(chosen)
                )
        return sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                      draft_probs, target_logits, *args, **kwargs)  # fmt: skip

    module.rejection_sample = rejection_sample
