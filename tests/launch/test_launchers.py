"""serve.sh and mtp_serve.sh: every shipped combination through vLLM's own parser, and every
bad knob refused before anything starts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.in_vllm.lmhead import plugin
from sparkserve.knobs.registry import KNOBS, Knob
from sparkserve.launch.versions import parse_release
from sparkserve.launch.vllm_command import EXTENSIBLE_KV_CACHE_FROM
from sparkserve.start.cli import run_start
from support import vllm_release
from support.cpu_launch import LAUNCHERS
from support.dry_runs import RECORD, dry_runs
from support.geometry import write_geometry_models
from support.launcher_runs import CHECKER, dry_run_argv, launcher_env, run_launcher, sentinel_bin

__all__ = ["sentinel_bin"]  # a fixture (support.launcher_runs) these tests use

REPO = Path(__file__).resolve().parents[2]

# launcher, knobs set, and what the engine configuration must then say
CASES: dict[str, tuple[str, dict[str, str], dict[str, object]]] = {
    "dflash-defaults": ("dflash", {}, {
        "speculative_method": "dflash", "num_speculative_tokens": 12,
        "enable_prefix_caching": True, "mamba_cache_mode": "align",
        "max_model_len": 262144, "max_num_seqs": 3, "max_num_batched_tokens": 8192,
        "gpu_memory_utilization": 0.82, "draft_architecture": "DFlashDraftModel",
        "tool_call_parser": "qwen3_xml", "reasoning_parser": "qwen3",
        "default_chat_template_kwargs": None,
        "shutdown_timeout": 50, "middleware": ["sparkserve.in_vllm.access.RequireKeyThenDrain"],
    }),
    "dflash-no-prefix-cache": ("dflash", {"PREFIX_CACHE": "0"}, {
        "speculative_method": "dflash", "enable_prefix_caching": False,
    }),
    "dflash-4-tokens-flex-drafter": (
        "dflash", {"NUM_SPEC_TOKENS": "4", "DRAFT_ATTENTION_BACKEND": "FLEX_ATTENTION"},
        {"speculative_method": "dflash", "num_speculative_tokens": 4},
    ),
    "dflash-limits": ("dflash", {
        "MAX_MODEL_LEN": "32768", "MAX_NUM_SEQS": "8", "MAX_BATCHED_TOKENS": "4096",
        "GPU_MEM": "0.7", "LOAD_FORMAT": "dummy",
    }, {
        "max_model_len": 32768, "max_num_seqs": 8, "max_num_batched_tokens": 4096,
        "gpu_memory_utilization": 0.7, "load_format": "dummy",
    }),
    "dflash-off-no-parsers": (
        "dflash", {"NUM_SPEC_TOKENS": "0", "TOOL_PARSER": "", "REASONING_PARSER": ""},
        {"speculative_method": None, "tool_call_parser": None, "reasoning_parser": ""},
    ),
    "dflash-thinking-off": ("dflash", {"THINKING": "0"}, {
        "reasoning_parser": "qwen3", "default_chat_template_kwargs": {"enable_thinking": False},
    }),
    "mtp-defaults": ("mtp", {}, {
        "speculative_method": "mtp", "num_speculative_tokens": 2,
        "enable_prefix_caching": True, "mamba_cache_mode": "align", "max_num_seqs": 3,
    }),
    "mtp-1-token-no-prefix-cache": ("mtp", {"NUM_SPEC_TOKENS": "1", "PREFIX_CACHE": "0"}, {
        "speculative_method": "mtp", "num_speculative_tokens": 1, "enable_prefix_caching": False,
    }),
    # A pair of Sparks (docs/CLUSTER.md); the loopback interface stands in for the link.
    "dflash-pair-tp-head": ("dflash", {
        "CLUSTER_NODES": "2", "CLUSTER_HEAD_ADDR": "127.0.0.1", "CLUSTER_IFACE": "lo",
    }, {
        "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2, "node_rank": 0,
        "master_addr": "127.0.0.1", "distributed_executor_backend": "mp",
        "distributed_timeout_seconds": 600, "headless": False,
        "speculative_method": "dflash", "enable_prefix_caching": True,
    }),
    "mtp-pair-pp-worker": ("mtp", {
        "CLUSTER_NODES": "2", "CLUSTER_RANK": "1", "CLUSTER_HEAD_ADDR": "127.0.0.2",
        "CLUSTER_IFACE": "lo", "CLUSTER_LAYOUT": "pp", "CLUSTER_JOIN_TIMEOUT_S": "90",
    }, {
        "tensor_parallel_size": 1, "pipeline_parallel_size": 2, "nnodes": 2, "node_rank": 1,
        "master_addr": "127.0.0.2", "distributed_timeout_seconds": 90, "headless": True,
        "speculative_method": "mtp",
    }),
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_geometry_models(tmp_path_factory.mktemp("geometry"))


@pytest.fixture(scope="module")
def engine_configs(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    target, drafter = models
    cases = {
        name: dry_run_argv(
            launcher, launcher_env(MODEL=str(target), DRAFT_MODEL=str(drafter), **knobs)
        )
        for name, (launcher, knobs, _) in CASES.items()
    }
    work = tmp_path_factory.mktemp("engine")
    (work / "in.json").write_text(json.dumps(cases))
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(work / "in.json"), str(work / "out.json")],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads((work / "out.json").read_text())


@pytest.mark.release
@pytest.mark.parametrize("case", sorted(CASES))
def test_vllm_builds_an_engine_config_for_every_shipped_combination(
    case: str, engine_configs: dict, models: tuple[Path, Path]
) -> None:
    result = engine_configs[case]
    assert result["ok"], result.get("error")
    launcher, _, expected = CASES[case]
    assert result["model"] == str(models[0])
    assert result["architecture"] == "Qwen3_5MoeForCausalLM"
    assert result["served_model_name"] == "qwen3.5-122b-a10b"
    if launcher == "dflash" and result["speculative_method"]:
        assert result["draft_model"] == str(models[1])
    for key, value in expected.items():
        assert result[key] == value, (key, result)
    # GPU_MEM stays a budget on a release that would otherwise size the pool after warm-up
    extensible_from = parse_release(vllm_release.release())[:2] >= EXTENSIBLE_KV_CACHE_FROM
    assert result["extensible_kv_cache"] is (False if extensible_from else None), result


def fake_vllm(tmp_path: Path, version: str) -> dict[str, str]:
    """The launcher's environment with a `vllm` package that says it is `version`."""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    env = launcher_env(DRY_RUN="1")
    env["PYTHONPATH"] = f"{REPO / 'src'}:{fake.parent}"
    return env


@pytest.mark.parametrize(("version", "kept"), [("0.33.0", False), ("0.34.0", True)])
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_gpu_mem_stays_a_budget_on_a_release_with_the_extensible_kv_cache(
    tmp_path: Path, launcher: str, version: str, kept: bool
) -> None:
    """From 0.34 the launchers pass --no-enable-extensible-kv-cache and say why; a KV_CACHE_GB
    size already turns it off, and then nothing is added."""
    env = fake_vllm(tmp_path, version)
    done = run_launcher(launcher, env)
    assert done.returncode == 0, done.stderr
    assert ("'--no-enable-extensible-kv-cache'" in done.stdout) is kept
    assert ("keeping GPU_MEM a budget" in done.stderr) is kept
    sized = run_launcher(launcher, {**env, "KV_CACHE_GB": "2"})
    assert sized.returncode == 0, sized.stderr
    assert "'--kv-cache-memory-bytes' '2147483648'" in sized.stdout
    assert "extensible" not in sized.stdout + sized.stderr


def bad_values(knob: Knob) -> list[str]:
    """Values the registry must refuse for `knob`, derived from its rule."""
    if knob.kind == "bool":
        return ["yes", "2"]
    if knob.kind in ("int", "float"):
        assert knob.minimum is not None and knob.maximum is not None
        values = ["abc", str(knob.minimum - 1), str(knob.maximum * 2), "nan"]
        return [*values, "1.5"] if knob.kind == "int" else values
    if knob.kind == "choice":
        return ["bogus"]
    if knob.shell_words:
        return ["--flag 'unbalanced"]
    assert knob.pattern is not None, f"{knob.name}: a text knob needs a pattern to check"
    return ["has a space!"]


# compose-only knobs (MODEL_CACHE) never reach the launcher; compose reads them
BAD = [(k, value) for k in KNOBS if k.scope == "container" for value in bad_values(k)]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_public_bind_address_without_a_key_is_one_line_exit_2(
    launcher: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = LAUNCHERS[launcher].name
    records = tmp_path / "records"
    code = run_start(launcher_env(BIND_ADDRESS="0.0.0.0"), launcher, prog, 1, records)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", "")
    assert records.read_text().splitlines() == [
        f"{prog}: BIND_ADDRESS='0.0.0.0' publishes the API beyond this machine without API_KEY: "
        "set API_KEY (every client then sends it), or BIND_ADDRESS=127.0.0.1"
    ]
    keyed = launcher_env(BIND_ADDRESS="0.0.0.0", API_KEY="k", DRY_RUN="1")
    assert run_start(keyed, launcher, prog, 1, records) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_host_run_binding_beyond_loopback_without_a_key_is_one_line_exit_2(
    launcher: str,
) -> None:
    """On a host (no image's SPARKSERVE_IMAGE) the launcher binds HOST itself, with nothing
    publishing it on BIND_ADDRESS: HOST beyond loopback (the registry's 0.0.0.0 included)
    needs API_KEY, as BIND_ADDRESS does; in a container HOST stays behind BIND_ADDRESS."""
    prog = LAUNCHERS[launcher].name
    for host in ("0.0.0.0", "192.168.1.20"):
        done = run_launcher(launcher, launcher_env(HOST=host, DRY_RUN="1"))
        assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
        assert done.stderr.splitlines() == [
            f"{prog}: HOST={host!r} binds the API beyond this machine without API_KEY (a run "
            "on the host, not in a container): set HOST=127.0.0.1, or API_KEY"
        ]
    unset = {k: v for k, v in launcher_env(DRY_RUN="1").items() if k != "HOST"}
    assert run_launcher(launcher, unset).returncode == 2, "the registry's 0.0.0.0 refuses too"
    for passes in ({"API_KEY": "k"}, {"SPARKSERVE_IMAGE": "cpu"}):
        done = run_launcher(launcher, launcher_env(HOST="0.0.0.0", DRY_RUN="1", **passes))
        assert done.returncode == 0, (passes, done.stderr)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize(("knob", "value"), BAD, ids=[f"{k.name}={v}" for k, v in BAD])
def test_bad_knob_value_is_one_line_exit_2_and_no_exports(
    launcher: str, knob: Knob, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every bad value of every knob, through the launcher's one step (`sparkserve start`,
    here in-process): exit 2, one line naming the knob and the value (a secret's value never)
    for the launcher to print, nothing else said and no variables, so the launcher stops
    before anything else."""
    if launcher not in knob.launchers:
        pytest.skip(f"{knob.name} is not read by the {launcher} launcher")
    prog = LAUNCHERS[launcher].name
    records = tmp_path / "records"
    code = run_start(launcher_env(**{knob.name: value}), launcher, prog, 1, records)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", "")
    lines = records.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: {knob.name}=")
    assert "must be" in lines[0]
    if knob.secret:
        assert value not in lines[0]
    else:
        assert repr(value) in lines[0]


# One bad value per knob through a real launcher (the launchers take turns): the wiring from
# the refusal to the exit, with nothing started.
WIRED = [
    (knob, bad_values(knob)[0], knob.launchers[index % len(knob.launchers)])
    for index, knob in enumerate(k for k in KNOBS if k.scope == "container")
]


@pytest.mark.parametrize(("knob", "value", "launcher"), WIRED, ids=[k.name for k, _, _ in WIRED])
def test_a_launcher_given_a_bad_knob_says_one_line_and_starts_nothing(
    knob: Knob, value: str, launcher: str, sentinel_bin: tuple[Path, Path]
) -> None:
    bin_dir, marker = sentinel_bin
    env = launcher_env(**{knob.name: value})
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = run_launcher(launcher, env)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{LAUNCHERS[launcher].name}: {knob.name}=")
    assert done.stdout == ""
    assert not marker.exists()


def test_gpu_mem_that_starves_the_os_is_refused_with_the_numbers(
    sentinel_bin: tuple[Path, Path],
) -> None:
    bin_dir, marker = sentinel_bin
    env = launcher_env(GPU_MEM="0.95", OS_RESERVE_GB="14")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = run_launcher("dflash", env)
    assert done.returncode == 2
    message = done.stderr.strip()
    assert message.startswith("serve.sh: GPU_MEM=0.95: 0.95 of ")
    assert "GiB to the OS, less than OS_RESERVE_GB=14" in message
    assert "the largest GPU_MEM that keeps it is" in message
    assert not marker.exists()


def test_launcher_runs_vllm_with_the_key_in_its_environment_only(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    bin_dir, marker = sentinel_bin
    env = launcher_env(API_KEY="s3cr3t-key", HF_TOKEN="hf_s3cr3t",
                       CLUSTER_SECRET="s3cr3t-pair-0123456789",
                       HF_HOME=str(tmp_path / "hf"))  # fmt: skip
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    for knob in ("MODEL", "DRAFT_MODEL"):  # on disk already: the fetch step finds them
        (tmp_path / knob).mkdir()
        env[knob] = str(tmp_path / knob)
    process = subprocess.Popen(
        [str(LAUNCHERS["dflash"])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=120)
    # vLLM is the launcher's child; one that ends by itself with status 0 is a failure
    assert (marker.parent / "vllm-ran.ppid").read_text().strip() == str(process.pid)
    assert process.returncode == 1, stderr
    ended = "serve.sh: vLLM ended by itself with status 0: its engine died (see above); exit 1"
    assert ended in stderr.splitlines(), stderr
    argv = (marker.parent / "vllm-ran.argv").read_text()
    child_env = (marker.parent / "vllm-ran.env").read_text().splitlines()
    assert "s3cr3t" not in argv and "s3cr3t" not in stdout + stderr
    assert "VLLM_API_KEY=s3cr3t-key" in child_env
    assert "HF_TOKEN=" in child_env, "vLLM runs offline: the launcher's token is blanked for it"
    assert not any(line.startswith("API_KEY=") for line in child_env)
    # no secret knob reaches vLLM's environment (the pair watch's secret, the Hub's token)
    assert not [line for line in child_env if "s3cr3t" in line and "VLLM_API_KEY" not in line]
    hf = tmp_path / "hf"
    for name, where in (
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TRITON_CACHE_DIR", "triton"),
        ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
        ("CUDA_CACHE_PATH", "nv-compute-cache"),
    ):  # the caches a start fills, on the model-cache volume
        assert f"{name}={hf / where}" in child_env
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in child_env
    assert "HF_HUB_OFFLINE=1" in child_env, "vLLM itself never downloads"
    assert ": a local folder, nothing to fetch" in stderr


def test_dry_run_hides_secrets_and_keeps_the_compile_cache_on_the_volume() -> None:
    done = run_launcher(
        "mtp", launcher_env(DRY_RUN="1", API_KEY="s3cr3t-key", HF_TOKEN="hf_s3cr3t")
    )
    assert done.returncode == 0, done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr
    assert "env: VLLM_API_KEY=<hidden>" in done.stdout
    assert "env: HF_TOKEN=''" in done.stdout, "vLLM runs offline: the token is blanked for it"
    assert "env: VLLM_CACHE_ROOT='/home/sparkserve/.cache/huggingface/vllm'" in done.stdout
    assert "env: TRITON_CACHE_DIR='/home/sparkserve/.cache/huggingface/triton'" in done.stdout
    assert "env: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS='0'" in done.stdout
    assert "guard: 'python3' '-m' 'sparkserve.guard.keeper' '--pid'" in done.stdout
    quiet = run_launcher("mtp", launcher_env(DRY_RUN="1", GUARD="0"))
    assert quiet.returncode == 0 and "guard:" not in quiet.stdout


@pytest.mark.parametrize(("launcher", "rows"), [("dflash", 3 * (12 + 1)), ("mtp", 3 * (2 + 1))])
def test_the_int8_heads_fallback_rows_are_this_launchers(launcher: str, rows: int) -> None:
    """Where vLLM's config has no scheduler settings, the head's plugin sizes for the rows the
    launch exported: MAX_NUM_SEQS x (NUM_SPEC_TOKENS + 1) of this launcher, not serve.sh's."""
    done = run_launcher(launcher, launcher_env(DRY_RUN="1"))
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(f"env: {plugin.ROWS_ENV}=")]
    exported = shlex.split(line.removeprefix(f"env: {plugin.ROWS_ENV}="))[0]
    assert plugin.launcher_rows({plugin.ROWS_ENV: exported}) == rows, line


def test_estimate_cudagraphs_can_be_restored() -> None:
    done = run_launcher(
        "dflash", launcher_env(DRY_RUN="1", VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS="1")
    )
    assert "env: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS='1'" in done.stdout


def test_extra_args_are_split_like_a_shell_and_come_last() -> None:
    argv = dry_run_argv("dflash", launcher_env(EXTRA_ARGS="--enforce-eager --seed '4 2'"))
    assert argv[-3:] == ["--enforce-eager", "--seed", "4 2"]


@pytest.mark.parametrize(
    ("version", "applied"), [("0.31.2", True), ("0.32.0", True), ("0.33.0", False)]
)
def test_dflash_prefix_cache_workaround_follows_the_vllm_release(
    tmp_path: Path, version: str, applied: bool
) -> None:
    env = fake_vllm(tmp_path, version)
    done = run_launcher("dflash", env)
    assert done.returncode == 0, done.stderr
    assert ('"disable_eagle_block_drop":true' in done.stdout) is applied
    assert ("vLLM issue #51250" in done.stderr) is applied
    assert ("'--mamba-cache-mode' 'align'" in done.stdout) is applied
    mtp = run_launcher("mtp", env)
    assert "disable_eagle_block_drop" not in mtp.stdout
    off = run_launcher("dflash", {**env, "PREFIX_CACHE": "0"})
    assert "disable_eagle_block_drop" not in off.stdout
    # no drafter, no speculative config: nothing to fix in it, and nothing said about it
    undrafted = run_launcher("dflash", {**env, "NUM_SPEC_TOKENS": "0"})
    assert undrafted.returncode == 0, undrafted.stderr
    assert "--speculative-config" not in undrafted.stdout
    assert "vLLM issue #51250" not in undrafted.stderr
    assert ("'--mamba-cache-mode' 'align'" in undrafted.stdout) is applied


def test_dry_run_of_a_pair_node_shows_the_link_environment_and_the_watch() -> None:
    env = launcher_env(CLUSTER_NODES="2", CLUSTER_RANK="1", CLUSTER_HEAD_ADDR="127.0.0.2",
                       CLUSTER_IFACE="lo", SPARKSERVE_STATE_DIR="/state")  # fmt: skip
    done = run_launcher("mtp", {**env, "DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in ("VLLM_HOST_IP='127.0.0.1'", "GLOO_SOCKET_IFNAME='lo'", "NCCL_SOCKET_IFNAME='lo'"):
        assert f"env: {name}" in lines
    assert not [line for line in lines if line.startswith("env: NCCL_IB_HCA=")]
    hca = run_launcher("mtp", {**env, "DRY_RUN": "1", "CLUSTER_IB_HCA": "rocep1s0f1,roceP2p1s0f1"})
    assert "env: NCCL_IB_HCA='rocep1s0f1,roceP2p1s0f1'" in hca.stdout.splitlines()
    bad = run_launcher("mtp", {**env, "DRY_RUN": "1", "CLUSTER_IB_HCA": "roce p1"})
    assert bad.returncode == 2 and bad.stderr.startswith("mtp_serve.sh: CLUSTER_IB_HCA='roce p1'")
    (watch,) = [shlex.split(line.removeprefix("watch: ")) for line in lines
                if line.startswith("watch: ")]  # fmt: skip
    assert watch[:3] == ["python3", "-m", "sparkserve.cluster.watch"]
    options = dict(zip(watch[3::2], watch[4::2], strict=True))
    assert options["--rank"] == "1" and options["--head-addr"] == "127.0.0.2"
    assert options["--host-ip"] == "127.0.0.1" and options["--port"] == "29510"
    assert options["--state-file"] == "/state/cluster-watch.json"
    assert options["--api-url"] == ""  # the worker serves no API


def test_dflash_across_pipeline_stages_is_refused_in_one_line() -> None:
    pair = launcher_env(CLUSTER_NODES="2", CLUSTER_HEAD_ADDR="127.0.0.1", CLUSTER_IFACE="lo",
                        CLUSTER_LAYOUT="pp", DRY_RUN="1")  # fmt: skip
    refused = run_launcher("dflash", pair)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "serve.sh: CLUSTER_LAYOUT='pp': vLLM does not serve the DFlash drafter across pipeline "
        "stages on Qwen3.5; use CLUSTER_LAYOUT=tp, mtp_serve.sh, or NUM_SPEC_TOKENS=0\n"
    )
    assert run_launcher("dflash", {**pair, "NUM_SPEC_TOKENS": "0"}).returncode == 0
    assert run_launcher("mtp", pair).returncode == 0
    assert run_launcher("dflash", {**pair, "CLUSTER_LAYOUT": "tp"}).returncode == 0


def test_one_node_has_no_cluster_arguments() -> None:
    argv = dry_run_argv("dflash", launcher_env(CLUSTER_IFACE="nonesuch"))
    assert not {"--nnodes", "--headless", "--tensor-parallel-size"} & set(argv)


def test_every_dry_run_is_the_recorded_one() -> None:
    """Each launcher x image x recipe, and the knobs users set most, prints the exact start
    recorded in tests/launch/data/dry_runs.json (first recorded at 0159394, before the launch
    plan's refactor; since then only the fetch line changed: its --plan-on-stdin came, and went
    with the one start step, whose fetch it shows as the command that makes the same one). A change
    here is a change to what starts: record it on purpose (`python tests/support/dry_runs.py`)
    and say why in the commit."""
    recorded = json.loads(RECORD.read_text())
    now = dry_runs()
    assert set(now) == set(recorded), "the cases changed: record them again"
    for case, output in now.items():
        assert output == recorded[case], case


def strict_env(tmp_path: Path, bin_dir: Path, **knobs: str) -> dict[str, str]:
    """A launcher environment for DRY_RUN=strict with both checkpoints as local folders."""
    env = launcher_env(DRY_RUN="strict", HF_HOME=str(tmp_path / "hf"), **knobs)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    for knob in ("MODEL", "DRAFT_MODEL"):
        if knob not in knobs:
            (tmp_path / knob).mkdir(exist_ok=True)
            env[knob] = str(tmp_path / knob)
    return env


@pytest.mark.parametrize("launcher", ["dflash", "mtp"])
def test_the_strict_dry_run_is_the_start_without_serving(
    launcher: str, sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    """DRY_RUN=strict (what scripts/up.sh runs before Compose touches the running server): the
    start's checks all pass, the command is DRY_RUN=1's to the letter, nothing is started,
    nothing is written to the model cache."""
    bin_dir, marker = sentinel_bin
    env = strict_env(tmp_path, bin_dir)
    done = run_launcher(launcher, env)
    assert done.returncode == 0, done.stderr
    name = LAUNCHERS[launcher].name
    assert done.stderr.splitlines()[-1] == (
        f"{name}: strict dry run: a start with these settings passes every check on this machine"
    )
    assert ": a local folder, nothing to fetch" in done.stderr
    plain = run_launcher(launcher, {**env, "DRY_RUN": "1"})
    assert plain.returncode == 0, plain.stderr
    pid = re.compile(r"'--pid' '[0-9]+'")  # the guard watches each launcher's own PID
    assert pid.sub("PID", done.stdout) == pid.sub("PID", plain.stdout)
    assert "exec: vllm serve " in done.stdout
    assert not marker.exists()
    assert not (tmp_path / "hf").exists()


def test_the_strict_dry_run_refuses_what_the_start_refuses(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each refusal a real start makes on this machine, with the start's status and one line,
    where DRY_RUN=1 (any machine's command) turns the memory's into a note and exits 0."""
    bin_dir, marker = sentinel_bin
    starved = strict_env(tmp_path, bin_dir, GPU_MEM="0.95", OS_RESERVE_GB="40")
    done = run_launcher("dflash", starved)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("serve.sh: GPU_MEM=0.95: 0.95 of "), line
    assert "less than OS_RESERVE_GB=40" in line, line
    noted = run_launcher("dflash", {**starved, "DRY_RUN": "1"})
    assert noted.returncode == 0, noted.stderr
    assert "this machine would refuse it: GPU_MEM=0.95" in noted.stderr

    absent = strict_env(tmp_path, bin_dir, MODEL=str(tmp_path / "nowhere"))
    done = run_launcher("dflash", absent)
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"serve.sh: MODEL={str(tmp_path / 'nowhere')!r}: no such folder"
    )
    assert not marker.exists()


def test_the_strict_dry_run_refuses_after_a_guard_stop_and_spends_nothing(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    """A guard record refuses the check as it refuses a start (exit 3, its line); with
    GUARD_RESUME=1 the check passes, as the new container's first start would, and leaves the
    record and the resume as they were: only a real start spends them."""
    bin_dir, marker = sentinel_bin
    state = tmp_path / "state"
    record = tmp_path / "hf" / "sparkserve" / "guard-stopped.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"reason": "MemAvailable 0.4 GiB below the floor 2.0 GiB"}\n')
    env = strict_env(tmp_path, bin_dir, SPARKSERVE_STATE_DIR=str(state))
    done = run_launcher("mtp", env)
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"mtp_serve.sh: the memory guard stopped vLLM last time ({record})")
    assert line.endswith("then start once with GUARD_RESUME=1"), line
    resumed = run_launcher("mtp", {**env, "GUARD_RESUME": "1"})
    assert resumed.returncode == 0, resumed.stderr
    assert record.is_file()
    assert not (state / "guard-resume-spent").exists()
    assert not marker.exists()


def test_a_start_with_a_shard_missing_offline_is_one_line_and_exit_4(
    sentinel_bin: tuple[Path, Path], tmp_path: Path
) -> None:
    """A cached snapshot whose index lists a shard that is gone: the start's fetch step refuses
    in one line naming it (exit 4), before vLLM, which would fail at load instead."""
    bin_dir, marker = sentinel_bin
    repo = tmp_path / "hf" / "hub" / "models--org--sharded"
    snapshot = repo / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    (snapshot / "config.json").write_text("{}")
    index = {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    env = launcher_env(HF_HOME=str(tmp_path / "hf"), MODEL="org/sharded", NUM_SPEC_TOKENS="0")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = run_launcher("dflash", env)
    assert done.returncode == 4, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"serve.sh: MODEL=org/sharded: {snapshot / 'model-00001-of-00001.safetensors'} is "
        "missing (model.safetensors.index.json lists it): start once with HF_OFFLINE=0 to "
        "fetch it"
    )
    assert not marker.exists()
