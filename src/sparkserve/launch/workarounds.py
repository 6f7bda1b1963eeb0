"""Known vLLM bugs the launchers work around, by release range and by the model's kind, each
with what it adds to vLLM's command: its own arguments, or fields of the speculative config."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkserve.knobs.registry import Launcher
from sparkserve.launch.versions import parse_release


@dataclass(frozen=True)
class Workaround:
    first: tuple[int, ...]  # first affected release
    last: tuple[int, ...]  # last affected release (inclusive; patch level ignored)
    launchers: tuple[Launcher, ...]
    needs_prefix_cache: bool
    reason: str
    needs_hybrid: bool = False  # only for a target with recurrent-state (Mamba-style) layers
    vllm_args: tuple[str, ...] = ()  # appended to `vllm serve`
    speculative_fields: dict[str, object] = field(default_factory=dict)  # into its JSON

    def applies(
        self,
        version: str,
        launcher: Launcher,
        prefix_cache: bool,
        speculating: bool,
        hybrid: bool,
    ) -> bool:
        """Whether the launcher adds it; a fix of the speculative config needs one (a
        launcher passes none with NUM_SPEC_TOKENS=0)."""
        try:
            release = parse_release(version)[:2]
        except ValueError:
            return False
        return (
            launcher in self.launchers
            and (prefix_cache or not self.needs_prefix_cache)
            and (speculating or not self.speculative_fields)
            and (hybrid or not self.needs_hybrid)
            and self.first[:2] <= release <= self.last[:2]
        )


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        first=(0, 30),
        last=(0, 32),
        launchers=("dflash",),
        needs_prefix_cache=True,
        reason=(
            "EAGLE's trailing-block drop is applied to DFlash, so prefix lookups miss "
            '(vLLM issue #51250, fixed in 0.33.0): adding "disable_eagle_block_drop": true'
        ),
        speculative_fields={"disable_eagle_block_drop": True},
    ),
    Workaround(
        first=(0, 23),
        last=(0, 32),
        launchers=("dflash", "mtp"),
        needs_prefix_cache=True,
        needs_hybrid=True,
        reason=(
            "prefix caching on a hybrid model needs Mamba align mode, which releases before "
            "0.33 take only from --mamba-cache-mode align: adding it"
        ),
        vllm_args=("--mamba-cache-mode", "align"),
    ),
)
