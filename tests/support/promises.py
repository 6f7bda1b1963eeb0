"""The time bounds the product promises, each named after where it is promised. A test that
asserts a duration asserts one of these, at the bound; every other time limit in the tests is
a generous guard against a hang, and the measured figures live in benchmarks/."""

from __future__ import annotations

import re
from pathlib import Path

from sparkserve.cluster import wire
from sparkserve.guard import keeper as guard_keeper
from sparkserve.guard.danger import DANGER_S

REPO = Path(__file__).resolve().parents[2]

# docs/MEMORY.md ("The guard"): in an emergency (MemAvailable under half the floor, an OOM kill
# in the server's cgroup) it stops the server within 2 s of the crossing (the engine SIGKILLed,
# the API server SIGTERMed; the exit follows within the grace).
GUARD_REACTION_S = 2.0

# docs/MEMORY.md ("The guard"): a danger that holds (MemAvailable under the floor, above half
# of it) stops the server within the danger window (guard/danger.py) plus that reaction, from
# MemAvailable crossing the floor.
GUARD_WINDOW_STOP_S = DANGER_S + GUARD_REACTION_S

# docs/MEMORY.md ("A guard that dies"): a guard killed while vLLM runs is noticed at once; a
# new one writes its state within 5 s (a Python start on a busy host), and at its 4th death in
# 10 minutes the keeper stops vLLM within 5 s instead.
GUARD_RESTART_S = 5.0

# docs/MEMORY.md ("A guard that dies"): a guard alive but taking no readings is killed by its
# keeper after HUNG_AFTER_S and replaced as a dead one is.
GUARD_HUNG_S = guard_keeper.HUNG_AFTER_S + GUARD_RESTART_S


def compose_stop_grace_s() -> float:
    """docker-compose.yml's stop_grace_period of the servers (one anchor, generated from
    SHUTDOWN_TIMEOUT_S's maximum): `docker stop` (and `compose down`) SIGKILL vLLM after it,
    so a SIGTERM stop, its drain included, must end within it."""
    text = (REPO / "docker-compose.yml").read_text()
    found = re.search(r"^x-stop-grace: &stop-grace (\d+)s$", text, re.MULTILINE)
    assert found, "docker-compose.yml has no x-stop-grace anchor"
    return float(found.group(1))


STOP_GRACE_S = compose_stop_grace_s()


def pair_stop_bound_s(peer_timeout_s: float, grace_s: float) -> float:
    """docs/CLUSTER.md ("The bound"): from a failure to both nodes' processes gone, silence
    (CLUSTER_PEER_TIMEOUT_S plus up to one beat) plus vLLM's exit (the grace, then a second
    for the SIGKILLed tree): CLUSTER_PEER_TIMEOUT_S + 7 s with the watch's 5 s grace."""
    return peer_timeout_s + wire.BEAT_S + grace_s + 1.0
