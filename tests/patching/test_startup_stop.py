"""The startup-stop patch against the release under test's own zmq_socket_ctx, and its
recognition of code it must leave alone (tests/e2e/test_stop_while_starting.py runs the
stop it fixes through the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.patching import STARTUP_STOP, State
from support import patch_runs, vllm_release

REPO = Path(__file__).resolve().parents[2]

# vLLM's zmq_socket_ctx with a KeyboardInterrupt raised inside it, as SIGTERM's handler raises
# it while the API server waits for the engine core.
INTERRUPT = """
import sys, zmq
from vllm.utils.network_utils import zmq_socket_ctx
try:
    with zmq_socket_ctx("ipc://" + sys.argv[1], zmq.ROUTER, bind=True):
        raise KeyboardInterrupt("terminated")
    print("swallowed")
except KeyboardInterrupt:
    print("raised")
"""


def sparkserve_patch(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return patch_runs.sparkserve_patch(STARTUP_STOP.info.name, *args)


def interrupt(site: Path, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT, str(tmp_path / "socket")],
        capture_output=True,
        text=True,
        timeout=300,
        # the copy first, even before the next release's sources (vllm_release.pythonpath)
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(site), vllm_release.pythonpath(REPO / "src")]),
        ),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture()
def release_copy(tmp_path: Path) -> Path:
    return patch_runs.release_copy(tmp_path)


@pytest.mark.release
def test_the_release_swallows_a_stop_and_the_patched_one_passes_it_on(
    release_copy: Path, tmp_path: Path
) -> None:
    assert interrupt(release_copy, tmp_path) == "swallowed"  # the bug, in vLLM's own code
    target = release_copy / "vllm" / STARTUP_STOP.info.target
    original = target.read_bytes()
    patch_runs.check_says_needed(STARTUP_STOP.info.name, release_copy, vllm_release.release())
    done = sparkserve_patch("--vllm-root", release_copy)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("applied: startup-stop")
    assert interrupt(release_copy, tmp_path) == "raised"
    again = sparkserve_patch("--vllm-root", release_copy)
    assert again.stdout.startswith("already applied: startup-stop"), again
    assert sparkserve_patch("--vllm-root", release_copy, "--revert").returncode == 0
    assert target.read_bytes() == original


CONTEXT = """
import contextlib

@contextlib.contextmanager
def zmq_socket_ctx(path):
    ctx = make()
    try:
        yield ctx
{handler}
    finally:
        ctx.destroy()
"""


@pytest.mark.parametrize(
    ("handler", "state"),
    [
        ('    except KeyboardInterrupt:\n        logger.debug("Got Keyboard Interrupt.")\n',
         State.NEEDED),
        ("    except KeyboardInterrupt:\n        pass\n", State.NEEDED),
        ('    except KeyboardInterrupt:\n        logger.debug("x")\n        raise\n',
         State.FIXED_UPSTREAM),
        ("    except OSError:\n        raise\n", State.FIXED_UPSTREAM),
        ("    except KeyboardInterrupt:\n        stopped = True\n", State.UNRECOGNISED),
    ],
    ids=["logs", "passes", "re-raises", "no-handler", "other-code"],
)  # fmt: skip
def test_recognition(handler: str, state: State) -> None:
    finding, span = STARTUP_STOP.classify(CONTEXT.format(handler=handler))
    assert finding.state is state, finding.detail
    assert (span is not None) == (state is State.NEEDED)


def test_a_file_without_the_function_is_unrecognised() -> None:
    finding, _ = STARTUP_STOP.classify("def other():\n    pass\n")
    assert finding.state is State.UNRECOGNISED
    assert "zmq_socket_ctx" in finding.detail


def test_the_patched_source_re_raises_and_reverts_to_the_same_bytes() -> None:
    source = CONTEXT.format(
        handler='    except KeyboardInterrupt:\n        logger.debug("Got Keyboard Interrupt.")\n'
    )
    patched = STARTUP_STOP.apply_source(source)
    assert "        raise\n" in patched
    assert STARTUP_STOP.classify(patched)[0].state is State.APPLIED
    assert STARTUP_STOP.revert_source(patched) == source
