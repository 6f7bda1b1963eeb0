"""The memory sampler keeps its rate (sparkserve.stress.sampler)."""

from __future__ import annotations

import itertools
import time

from sparkserve.stress.sampler import MemorySampler


def test_sampler_keeps_its_rate_while_this_process_is_busy() -> None:
    """It samples in a process of its own: this one holding the GIL in long C calls (as
    building big prompts and parsing streams under memory pressure did) does not slow it."""
    sampler = MemorySampler(20.0, nvidia_smi=None).start()
    sampler.phase("busy")
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        blob = b"\x01" * (256 << 20)  # one C call: the GIL is held until it returns
        del blob
    samples = sampler.stop()
    span = samples[-1].t - samples[0].t
    assert (len(samples) - 1) / span >= 18
    assert max(b.t - a.t for a, b in itertools.pairwise(samples)) < 0.15
    assert {s.phase for s in samples[1:]} == {"busy"}
    psi = [s.psi_full_pct for s in samples[1:]]
    assert all(p is None for p in psi) or all(0 <= p <= 100 for p in psi if p is not None)
