"""`sparkserve stress`'s command line before any load: a server that is down, a knob that is
out of range (the runs against real servers: tests/e2e/test_stress_server.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.cli import main
from support.vllm_server import free_port


def test_server_down_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["stress", "--url", url, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("sparkserve stress: server not usable:") and url in err
    assert "connection refused" in err and "\n" not in err
    assert not (tmp_path / "x").exists()


def test_os_reserve_comes_from_the_knob(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OS_RESERVE_GB", "2")  # under the knob's minimum of 4
    code = main(["stress", "--url", f"http://127.0.0.1:{free_port()}"])
    assert code == 2  # the knob's own rule refuses it before the server is tried
