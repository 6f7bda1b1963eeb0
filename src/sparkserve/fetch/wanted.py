"""Which checkpoints a start needs: the knob naming each (MODEL, DRAFT_MODEL) and its reference,
a Hugging Face repo id or a local folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkserve.launch.settings import Settings


@dataclass(frozen=True)
class Wanted:
    knob: str  # the knob naming it: MODEL or DRAFT_MODEL
    ref: str  # a Hugging Face repo id or a local folder


def wanted(settings: Settings) -> list[Wanted]:
    """The checkpoints the launcher's vLLM command will load with these settings."""
    return [Wanted(knob, ref) for knob, ref in settings.models()]


def is_local(ref: str) -> bool:
    return ref.startswith(("/", "./", "../")) or Path(ref).is_dir()
