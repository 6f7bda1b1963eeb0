"""The tune's candidates, the plan's refusals, the knob lines into a .env, and the refusals of
a server that is not sparkserve's (sparkserve.tune), without a server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.command_line import UsageError
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.vllm_command import speculative_config
from sparkserve.memory.budget import largest_gpu_mem
from sparkserve.memory.host import GIB
from sparkserve.tune.candidates import (
    default_memory_values,
    memory_candidates,
    parse_lengths,
    parse_values,
)
from sparkserve.tune.cli import write_env
from sparkserve.tune.workload import file_prompts
from support.tmpfs import tiny_tmpfs

SPARK = 128 * GIB  # about a Spark's unified memory (the plan's figure is 121.7 GiB)


def test_gpu_mem_candidates_start_at_the_plans_largest_and_step_down() -> None:
    top = largest_gpu_mem(14, SPARK)
    values = default_memory_values("GPU_MEM", 14, SPARK, 0, 3, 0.03)
    assert values == [f"{top:.2f}", f"{top - 0.03:.2f}", f"{top - 0.06:.2f}"]
    assert all(c.refused is None for c in memory_candidates("GPU_MEM", values, 14, SPARK, 0))


def test_a_candidate_the_plan_says_cannot_fit_is_refused_with_its_reason() -> None:
    over = memory_candidates("GPU_MEM", ["0.95", "0.8"], 14, SPARK, 0)
    assert [c.value for c in over] == ["0.95", "0.8"]
    assert over[0].refused is not None and "OS_RESERVE_GB=14" in over[0].refused
    assert over[1].refused is None
    pools = memory_candidates("KV_CACHE_GB", ["2", "20"], 4, 24 * GIB, 1 * GIB)
    assert [c.value for c in pools] == ["20", "2"]
    assert pools[0].refused is not None and "KV_CACHE_GB=20" in pools[0].refused
    assert pools[1].refused is None


@pytest.mark.parametrize("text", ["", "0.5,x", "0.99", "0.5,0.5"])
def test_bad_candidates_are_one_line(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_values("GPU_MEM", text, "--candidates")
    assert repr(text) in str(info.value) and "\n" not in str(info.value)


def test_lengths_parse_and_refuse_what_the_knob_does_not_allow() -> None:
    assert parse_lengths("0, 2,4", 16) == [0, 2, 4]
    for text in ("", "2,2", "17", "a"):
        with pytest.raises(UsageError, match="from 0 to 16"):
            parse_lengths(text, 16)


def test_write_env_replaces_the_knobs_line_or_appends_it(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("# mine\nGPU_MEM=0.82\nPORT=8000\n")
    write_env(env, {"GPU_MEM": "0.76", "NUM_SPEC_TOKENS": "8"})
    assert env.read_text() == "# mine\nGPU_MEM=0.76\nPORT=8000\nNUM_SPEC_TOKENS=8\n"


def test_write_env_keeps_the_files_mode_and_every_other_line(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("API_KEY=secret\nHF_TOKEN=hf_abc\nGPU_MEM=0.82\n")
    env.chmod(0o600)
    write_env(env, {"GPU_MEM": "0.78"})
    assert env.read_text() == "API_KEY=secret\nHF_TOKEN=hf_abc\nGPU_MEM=0.78\n"
    assert env.stat().st_mode & 0o7777 == 0o600
    assert os.listdir(tmp_path) == [".env"]


def test_write_env_on_a_full_disk_leaves_the_env_as_it_was(tmp_path: Path) -> None:
    """The API key and the token survive a rewrite that cannot be written: a tmpfs too small
    for the new file."""
    with tiny_tmpfs(tmp_path / "disk", size="8k") as disk:
        env = disk / ".env"
        old = "API_KEY=secret\nHF_TOKEN=hf_abc\n" + "# padding\n" * 600  # 2 pages of 2: full
        env.write_text(old)
        env.chmod(0o600)
        with pytest.raises(OSError, match="No space left on device"):
            write_env(env, {"GPU_MEM": "0.78"})
        assert env.read_text() == old and env.stat().st_mode & 0o7777 == 0o600
        assert os.listdir(disk) == [".env"]


def test_prompts_file_lines_must_hold_a_prompt(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert [p.text for p in file_prompts(good)] == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(UsageError, match="line 2 is not a JSON object"):
        file_prompts(bad)


def test_the_ngram_method_gets_vllms_prompt_lookup_config() -> None:
    settings = resolve_settings({"SPEC_METHOD": "ngram", "NUM_SPEC_TOKENS": "3"}, "mtp")
    assert speculative_config(settings, {"ignored": True}) == (
        '{"method":"ngram","prompt_lookup_min":2,"prompt_lookup_max":4,"num_speculative_tokens":3}'
    )


def test_a_process_that_is_not_a_sparkserve_server_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    # A plain process (no launcher exported SPARK_LMHEAD_CALIBRATE to it) behind a pid file;
    # the URL answers /v1/models like any vLLM would.
    other = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        assert other.stdout is not None
        port = other.stdout.readline().strip()
        pid_file = tmp_path / "pid"
        pid_file.write_text(f"{other.pid}\n")
        done = subprocess.run(
            [sys.executable, "-m", "sparkserve", "tune", "memory", "--driver", "launcher",
             "--pid-file", str(pid_file), "--url", f"http://127.0.0.1:{port}",
             "--out", str(tmp_path / "out"), "--candidates", "0.5"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        other.kill()
        other.wait()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a server of sparkserve's launchers" in lines[0]
    assert not (tmp_path / "out").exists()


SERVER = """
import http.server, json
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "other", "max_model_len": 4096}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Models)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
