"""The memory sampler samples from a process of its own (sparkserve.stress.sampler); the rate
it keeps while its parent is busy is measured by benchmarks/sampler_rate.py."""

from __future__ import annotations

import itertools
import os
import time

import psutil

from sparkserve.stress.sampler import MemorySampler


def test_sampler_keeps_sampling_while_this_process_holds_the_gil() -> None:
    """Its probe is another process: this one holding the GIL in long C calls (as building big
    prompts and parsing streams under memory pressure did) does not stop the rows coming, each
    tagged with the phase of its moment, in time order."""
    sampler = MemorySampler(20.0, nvidia_smi=None).start()
    assert sampler._probe is not None
    probe = psutil.Process(sampler._probe.pid)
    assert probe.pid != os.getpid() and "sparkserve.stress.host_probe" in probe.cmdline()
    sampler.phase("busy")
    busy_from = sampler.now()
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        blob = b"\x01" * (256 << 20)  # one C call: the GIL is held until it returns
        del blob
    busy_to = sampler.now()
    samples = sampler.stop()
    during = [s for s in samples if busy_from < s.t <= busy_to]
    assert len(during) >= 2, samples  # rows kept coming: not a rate, which the benchmark has
    assert all(a.t < b.t for a, b in itertools.pairwise(samples))
    assert {s.phase for s in during} == {"busy"}
    psi = [s.psi_full_pct for s in samples[1:]]
    assert all(p is None for p in psi) or all(0 <= p <= 100 for p in psi if p is not None)
