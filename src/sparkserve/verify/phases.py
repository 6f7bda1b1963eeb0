"""The settings verify serves, one restart each, derived from the setting the server runs with:
only the features it uses are checked, and each phase changes only what its comparison needs.
Every phase names the whole of the three knobs verify touches (a launcher driver keeps what a
restart gave it), and the run ends on the starting setting, interrupted or not."""

from __future__ import annotations

from dataclasses import dataclass

from sparkserve.launch.settings import Settings

TOUCHED = ("PREFIX_CACHE", "NUM_SPEC_TOKENS", "SPARK_KEEP_BF16_LMHEAD")
CHECKS = ("api", "prefix", "speculation", "head")
SERVED, PREFIX_OFF, BF16, PLAIN = "served", "prefix cache off", "bf16 head", "plain int8"


@dataclass(frozen=True)
class Phase:
    name: str
    changes: dict[str, str]  # over the starting setting
    why: str


@dataclass(frozen=True)
class Uses:
    """What the running server uses, as its settings say."""

    speculating: bool
    int8_head: bool
    prefix_cache: bool

    @classmethod
    def of(cls, served: Settings) -> Uses:
        return cls(served.speculating, not served.values.SPARK_KEEP_BF16_LMHEAD,
                   served.values.PREFIX_CACHE)  # fmt: skip


def plan(uses: Uses, checks: set[str]) -> list[Phase]:
    phases = [Phase(SERVED, {}, "the setting it runs with")]
    if "prefix" in checks and uses.prefix_cache:
        phases.append(Phase(PREFIX_OFF, {"PREFIX_CACHE": "0"}, "the reference for the cache"))
    head = "head" in checks and uses.int8_head
    if head:
        phases.append(Phase(BF16, {"NUM_SPEC_TOKENS": "0", "SPARK_KEEP_BF16_LMHEAD": "1"},
                            "the reference for the int8 head"))  # fmt: skip
    if ("speculation" in checks and uses.speculating) or head:
        # the int8 head without drafting: speculation's reference, and the head's scorer
        changes = {"NUM_SPEC_TOKENS": "0"} if uses.speculating else {}
        phases.append(Phase(PLAIN, changes, "the plain model with the int8 head"))
    return phases


def restarts_line(plan: list[Phase]) -> str:
    """How many restarts a plan costs: one per setting after the served one (each differs
    from the one before), and one back unless the last setting is the starting one."""
    count = len(plan) - 1
    back = " and one back" if plan[-1].changes else ""
    return f"{count} restart{'s' if count != 1 else ''}{back}"
