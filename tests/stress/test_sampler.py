"""The memory sampler keeps its rate (sparkserve.stress.sampler)."""

from __future__ import annotations

import itertools
import time

from sparkserve.stress.sampler import MemorySampler


def test_sampler_keeps_its_rate() -> None:
    sampler = MemorySampler(20.0, nvidia_smi=None).start()
    time.sleep(1.5)
    samples = sampler.stop()
    span = samples[-1].t - samples[0].t
    assert (len(samples) - 1) / span >= 18
    assert max(b.t - a.t for a, b in itertools.pairwise(samples)) < 0.15
