"""The cpu-conv-layout patch: vLLM's own CPU conv kernel refuses a one-token prefill and the
patched wrapper serves it (in the CPU serving venv, which carries the image's patches); the
patch against the release under test's file; its recognition of code it must leave alone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkserve.patching import CPU_CONV_LAYOUT, State
from support import patch_runs, vllm_release

REPO = Path(__file__).resolve().parents[2]

# A one-token prefill as vLLM's GatedDeltaNet hands it over: mixed_qkv is a column slice of
# the wider projection, `.contiguous()` keeps it (one row), and the callers transpose it.
ONE_TOKEN = """
import json, torch
import vllm._custom_ops as ops
from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as gdn
from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

# vLLM's own predicates for its C++ conv (the prefill path and the speculative one)
if not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        or gdn.is_arm_bf16()):
    print(json.dumps({"kernel": False}))
    raise SystemExit
torch.manual_seed(0)
dim, wider, width = 64, 96, 4
mixed_qkv = torch.randn(1, wider, dtype=torch.bfloat16)[:, :dim].contiguous()
weight = torch.randn(dim, width, dtype=torch.bfloat16)
bias = torch.randn(dim, dtype=torch.bfloat16)
def call(conv, **extra):
    return conv(x=mixed_qkv.transpose(0, 1), weight=weight, bias=bias,
                conv_states=torch.zeros(2, dim, width - 1, dtype=torch.bfloat16),
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                cache_indices=torch.tensor([1], dtype=torch.int32),
                has_initial_state=torch.tensor([False]), **extra)
try:
    call(ops.causal_conv1d_fwd_cpu, silu_activation=True, is_weight_packed=False)
    raw = "served"
except RuntimeError as error:
    raw = str(error)
out = call(gdn._causal_conv1d_fwd_cpu, silu_activation=True, is_weight_packed=False)
ref = call(causal_conv1d_fn_cpu, activation="silu")
print(json.dumps({"kernel": True, "raw": raw, "shape": list(out.shape),
                  "error": (out.float() - ref.float()).abs().max().item()}))
"""


def test_the_kernel_refuses_a_one_token_prefill_and_the_patched_wrapper_serves_it(
    cpu_venv_python: str,
) -> None:
    done = subprocess.run(
        [cpu_venv_python, "-c", ONE_TOKEN], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["kernel"]:
        pytest.skip("vLLM runs its C++ conv only on an AVX-512 BF16, AMX or Arm-bf16 CPU")
    assert "expect x to be transposed" in result["raw"]  # the bug, in vLLM's own kernel
    assert result["shape"] == [64, 1]
    assert result["error"] < 0.05, result  # bf16 rounding against vLLM's torch conv


@pytest.fixture()
def release_copy(tmp_path: Path) -> Path:
    return patch_runs.release_copy(tmp_path)


@pytest.mark.release
def test_the_release_needs_it_and_it_applies_once_and_reverts(release_copy: Path) -> None:
    name = CPU_CONV_LAYOUT.info.name
    target = release_copy / "vllm" / CPU_CONV_LAYOUT.info.target
    original = target.read_bytes()
    patch_runs.check_says_needed(name, release_copy, vllm_release.release())
    done = patch_runs.sparkserve_patch(name, "--vllm-root", release_copy)
    assert done.returncode == 0 and done.stdout.startswith(f"applied: {name}"), done
    patched = target.read_text()
    compile(patched, str(target), "exec")
    assert "torch.contiguous_format" in patched
    again = patch_runs.sparkserve_patch(name, "--vllm-root", release_copy)
    assert again.stdout.startswith(f"already applied: {name}"), again
    reverted = patch_runs.sparkserve_patch(name, "--vllm-root", release_copy, "--revert")
    assert reverted.returncode == 0, reverted
    assert target.read_bytes() == original


WRAPPER = """
import torch

def _causal_conv1d_fwd_cpu(*, x, weight, conv_states):
{body}
"""
CALL = "    return ops.causal_conv1d_fwd_cpu(x=x, weight=weight, conv_states=conv_states)\n"


@pytest.mark.parametrize(
    ("body", "state"),
    [
        (CALL, State.NEEDED),
        ('    """Docstring."""\n' + CALL, State.NEEDED),
        ("    x = x.contiguous()\n" + CALL, State.FIXED_UPSTREAM),
        ("    return torch_conv(x, weight)\n", State.UNRECOGNISED),
    ],
    ids=["bare", "docstring", "lays-x-out", "no-kernel"],
)
def test_recognition(body: str, state: State) -> None:
    finding, span = CPU_CONV_LAYOUT.classify(WRAPPER.format(body=body))
    assert finding.state is state, finding.detail
    assert (span is not None) == (state is State.NEEDED)


def test_a_file_without_the_wrapper_is_unrecognised() -> None:
    finding, _ = CPU_CONV_LAYOUT.classify("def other():\n    pass\n")
    assert finding.state is State.UNRECOGNISED and "_causal_conv1d_fwd_cpu" in finding.detail


def test_the_patched_wrapper_lays_x_out_first_and_reverts_to_the_same_bytes() -> None:
    source = WRAPPER.format(body='    """Docstring."""\n' + CALL)
    patched = CPU_CONV_LAYOUT.apply_source(source)
    body = patched.split('"""Docstring."""\n', 1)[1]
    fix = body.index("\n    if not (x.stride(-2) == 1")
    assert fix < body.index("\n    return ops.causal_conv1d_fwd_cpu")  # code, not the comment
    assert CPU_CONV_LAYOUT.classify(patched)[0].state is State.APPLIED
    assert CPU_CONV_LAYOUT.revert_source(patched) == source
