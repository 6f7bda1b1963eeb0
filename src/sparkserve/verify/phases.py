"""The settings verify serves, one restart each, derived from the setting the server runs with:
only the features it uses are checked, and each phase changes only what its comparison needs.
Every phase names the whole of the three knobs verify touches (a launcher driver keeps what a
restart gave it), and the run ends on the starting setting, interrupted or not."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sparkserve.settings import Settings
from sparkserve.tune.driver import Driver
from sparkserve.tune.restarts import ignoring_signals

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
        return cls(served.speculating, not served.flag("SPARK_KEEP_BF16_LMHEAD"),
                   served.flag("PREFIX_CACHE"))  # fmt: skip


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


@dataclass
class Restarter:
    """The server's setting as verify changes it; `current` is None while a restart is under
    way. `restore` puts the starting setting back, whatever signals arrive meanwhile."""

    driver: Driver
    start: dict[str, str | None]  # None: unset when verify began, and unset again at the end
    healthy_timeout_s: float
    say: Callable[[str], None]
    current: dict[str, str | None] | None = None
    took_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current = dict(self.start)

    @classmethod
    def of(cls, driver: Driver, healthy_timeout_s: float, say: Callable[[str], None]) -> Restarter:
        knobs = driver.knobs()
        return cls(driver, {k: knobs.get(k) for k in TOUCHED}, healthy_timeout_s, say)

    def serve(self, phase: Phase) -> None:
        wanted: dict[str, str | None] = {**self.start, **phase.changes}
        if wanted == self.current:
            return
        self.say(f"[verify] restarting for '{phase.name}' ({phase.why}): {_show(phase.changes)}")
        self.current = None
        took = self.driver.restart(wanted, self.healthy_timeout_s)
        self.current = wanted
        self.took_s.append(took)
        self.say(f"[verify] healthy after {took:.1f} s")

    def restore(self) -> None:
        with ignoring_signals():
            if self.current != self.start:
                self.say("[verify] restoring the starting setting")
                self.current = None
                self.driver.restart(self.start, self.healthy_timeout_s)
                self.current = dict(self.start)
                self.say("[verify] the server runs with its starting setting again")


def _show(changes: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in changes.items()) or "the starting setting"


def restarts_line(plan: list[Phase]) -> str:
    """How many restarts a plan costs: one per setting after the served one (each differs
    from the one before), and one back unless the last setting is the starting one."""
    count = len(plan) - 1
    back = " and one back" if plan[-1].changes else ""
    return f"{count} restart{'s' if count != 1 else ''}{back}"
