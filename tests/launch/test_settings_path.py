"""The one settings path, end to end: from what a user sets (the environment, `.env`, an edited
compose line, a RECIPE) to the argv and environment vLLM gets.

- The table: for each launcher x image x recipe (none, or each recipe that serves with the
  launcher) x target kind (hybrid, plain), every knob that reaches vLLM unset, set to its
  default and set to another value, through `sparkserve.launch.settings` and
  `sparkserve.launch.vllm_command`, against the documented order computed here on its own.
- Every server service of docker-compose.yml in every profile, from the real Docker Compose v2
  (`docker compose config`) through its launcher's dry run: the argv is the launcher's and the
  image's documented defaults (MTP: 2 speculative tokens), also with a `.env` that sets knobs,
  one that sets a knob to its registry default against a recipe, and a RECIPE switch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve import recipes
from sparkserve.knobs.registry import BY_NAME, IMAGE_ENV, IMAGES, LAUNCHERS, Image, Knob, Launcher
from sparkserve.launch.settings import resolve_settings
from sparkserve.launch.start_parts import target_is_hybrid
from sparkserve.launch.vllm_command import vllm_command
from sparkserve.memory.host import GIB
from support.compose_config import compose_config
from support.launcher_runs import dry_run_argv, launcher_env

REPO = Path(__file__).resolve().parents[2]
RECIPES = {recipe.name: recipe for recipe in recipes.load_all()}

# How each knob that reaches vLLM shows in its command: (flag, how the value reads there).
FLAGS: dict[str, str] = {
    "MODEL": "--model", "SERVED_MODEL_NAME": "--served-model-name", "HOST": "--host",
    "PORT": "--port", "GPU_MEM": "--gpu-memory-utilization", "MAX_MODEL_LEN": "--max-model-len",
    "MAX_NUM_SEQS": "--max-num-seqs", "MAX_BATCHED_TOKENS": "--max-num-batched-tokens",
    "LOAD_FORMAT": "--load-format", "TOOL_PARSER": "--tool-call-parser",
    "REASONING_PARSER": "--reasoning-parser", "SHUTDOWN_TIMEOUT_S": "--shutdown-timeout",
}  # fmt: skip
ENV: dict[str, str] = {
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
    "SPARK_KEEP_BF16_LMHEAD": "SPARK_KEEP_BF16_LMHEAD",
    "SPARK_LMHEAD_CALIBRATE": "SPARK_LMHEAD_CALIBRATE",
    "HF_HOME": "HF_HOME",
    "API_KEY": "VLLM_API_KEY",
    "METRICS_OPEN": "METRICS_OPEN",  # read there by sparkserve.in_vllm.access
    "MAX_REQUEST_MB": "MAX_REQUEST_MB",
}
SPECULATIVE = {
    "NUM_SPEC_TOKENS": "num_speculative_tokens",
    "DRAFT_MODEL": "model",
    "DRAFT_ATTENTION_BACKEND": "attention_backend",
}
OTHER = {
    "MODEL": "org/other-model", "SERVED_MODEL_NAME": "other", "HOST": "127.0.0.1",
    "PORT": "9100", "GPU_MEM": "0.5", "MAX_MODEL_LEN": "4096", "MAX_NUM_SEQS": "5",
    "MAX_BATCHED_TOKENS": "2048", "LOAD_FORMAT": "dummy", "TOOL_PARSER": "hermes",
    "REASONING_PARSER": "deepseek_r1", "KV_CACHE_GB": "1.5", "PREFIX_CACHE": "0",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1", "SPARK_KEEP_BF16_LMHEAD": "1",
    "SPARK_LMHEAD_CALIBRATE": "off", "HF_HOME": "/cache", "API_KEY": "k3y",
    "NUM_SPEC_TOKENS": "4", "DRAFT_MODEL": "org/other-drafter",
    "DRAFT_ATTENTION_BACKEND": "FLEX_ATTENTION", "SHUTDOWN_TIMEOUT_S": "20",
    "METRICS_OPEN": "1", "MAX_REQUEST_MB": "64", "THINKING": "0",
}  # fmt: skip
MODES = ("unset", "default", "other")


def documented(knob: Knob, launcher: Launcher, image: Image, recipe: recipes.Recipe | None) -> str:
    """The value an unset knob takes, by docs/KNOBS.md's order, computed without the
    resolver: a recipe's value, else the launcher's default, else the image's, else the
    registry's."""
    if recipe is not None and knob.name in recipe.knobs_for(launcher):
        return recipe.knobs_for(launcher)[knob.name]
    if launcher == "mtp" and knob.mtp_default is not None:
        return knob.mtp_default
    if image == "cpu" and knob.cpu_default is not None:
        return knob.cpu_default
    return knob.default


def shown(argv: tuple[str, ...], env: dict[str, str], name: str) -> str | None:
    """How knob `name` reads in vLLM's argv or environment (None: absent)."""
    if name in FLAGS:
        flag = FLAGS[name]
        return argv[argv.index(flag) + 1] if flag in argv else None
    if name in ENV:
        return env.get(ENV[name])
    if name == "KV_CACHE_GB":
        flag = "--kv-cache-memory-bytes"
        return argv[argv.index(flag) + 1] if flag in argv else None
    if name == "PREFIX_CACHE":
        return "1" if "--enable-prefix-caching" in argv else "0"
    if name == "THINKING":
        flag = "--default-chat-template-kwargs"
        kwargs = json.loads(argv[argv.index(flag) + 1]) if flag in argv else {}
        return "0" if kwargs.get("enable_thinking") is False else "1"
    if "--speculative-config" not in argv:
        return None
    value = json.loads(argv[argv.index("--speculative-config") + 1]).get(SPECULATIVE[name])
    return None if value is None else str(value)


def expected_shown(name: str, value: str, launcher: Launcher, speculating: bool) -> str | None:
    if name == "KV_CACHE_GB":
        return str(int(float(value) * GIB)) if value else None
    optional = ("TOOL_PARSER", "REASONING_PARSER", "API_KEY", "DRAFT_ATTENTION_BACKEND")
    if name in optional and not value:
        return None  # empty: the flag is left out
    drafter_only = name != "NUM_SPEC_TOKENS" and launcher != "dflash"
    if name in SPECULATIVE and (not speculating or drafter_only):
        return None
    return value


@pytest.fixture(scope="module")
def plain_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of the cpu image default's own architecture: attention layers only."""
    folder = tmp_path_factory.mktemp("plain")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 512, "intermediate_size": 128,
    }))  # fmt: skip
    return folder


CASES = [
    (launcher, image, recipe)
    for launcher in LAUNCHERS
    for image in IMAGES
    for recipe in [None, *(r for r in RECIPES.values() if launcher in r.launchers)]
]


@pytest.mark.parametrize(
    ("launcher", "image", "recipe"),
    CASES,
    ids=[f"{lr}-{im}-{r.name if r else 'no-recipe'}" for lr, im, r in CASES],
)
def test_every_knob_reaches_vllm_unset_at_its_default_and_set_as_set(
    launcher: Launcher, image: Image, recipe: recipes.Recipe | None
) -> None:
    base = {IMAGE_ENV: image, **({"RECIPE": recipe.name} if recipe else {})}
    for name in [*FLAGS, *ENV, "KV_CACHE_GB", "PREFIX_CACHE", "THINKING", *SPECULATIVE]:
        knob = BY_NAME[name]
        if launcher not in knob.launchers:
            continue
        default = documented(knob, launcher, image, recipe)
        for mode in MODES:
            value = {"unset": default, "default": knob.default, "other": OTHER[name]}[mode]
            env = dict(base) if mode == "unset" else {**base, name: value}
            settings = resolve_settings(env, launcher)
            assert settings.text[name] == value, (name, mode)
            assert (settings.layer[name] == "user") is (mode != "unset"), (name, mode)
            command = vllm_command(settings, "0.33.0", hybrid=True)
            want = expected_shown(name, value, launcher, settings.speculating)
            assert shown(command.argv, command.env, name) == want, (name, mode, command.argv)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_mamba_align_flag_follows_the_targets_own_config(
    launcher: Launcher, version: str, plain_target: Path
) -> None:
    """Prefix caching on vLLM 0.23-0.32 needs --mamba-cache-mode align for a hybrid target and
    must not get it for a plain one (the engine dies on the first request)."""
    for image in IMAGES:
        plain = resolve_settings({IMAGE_ENV: image, "MODEL": str(plain_target)}, launcher)
        assert target_is_hybrid(plain) == (False, "")
        argv = vllm_command(plain, version, *[target_is_hybrid(plain)[0]]).argv
        assert "--mamba-cache-mode" not in argv and "--enable-prefix-caching" in argv
        # the shipped 122B recipe's geometry: a hybrid (GatedDeltaNet) target
        hybrid = resolve_settings({IMAGE_ENV: image, "MODEL": str(REPO / "recipes" /
                                  "qwen3.5-122b-a10b")}, launcher)  # fmt: skip
        assert target_is_hybrid(hybrid) == (True, "")
        argv = vllm_command(hybrid, version, hybrid=True).argv
        assert ("--mamba-cache-mode" in argv) is (version == "0.32.0"), (image, version)


def middlewares(argv: tuple[str, ...]) -> list[str]:
    """The --middleware values, in order."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--middleware"]


def test_a_stop_drains_behind_the_refusing_middleware_or_aborts_at_zero() -> None:
    drains = vllm_command(resolve_settings({}, "dflash"), "0.32.0", hybrid=True).argv
    assert value(list(drains), "--shutdown-timeout") == BY_NAME["SHUTDOWN_TIMEOUT_S"].default
    # one --middleware (vLLM warns of a second): the key and the body limit, then the drain
    assert middlewares(drains) == ["sparkserve.in_vllm.access.RequireKeyThenDrain"]
    aborts = vllm_command(resolve_settings({"SHUTDOWN_TIMEOUT_S": "0"}, "mtp"), "0.33.0",
                          hybrid=True).argv  # fmt: skip
    assert value(list(aborts), "--shutdown-timeout") == "0"
    # guarded without a drain
    assert middlewares(aborts) == ["sparkserve.in_vllm.access.RequireKey"]


# ---------------------------------------------------------------- through the real compose

SERVERS = {  # profile -> (server service, launcher, image)
    "": ("sparkserve", "dflash", "spark"),
    "mtp": ("sparkserve-mtp", "mtp", "spark"),
    "cpu": ("sparkserve-cpu", "dflash", "cpu"),
    "cluster-head": ("sparkserve-head", "dflash", "spark"),
    "cluster-worker": ("sparkserve-worker", "dflash", "spark"),
}
# The loopback interface stands in for a pair's link on this machine.
LINK = "CLUSTER_HEAD_ADDR=127.0.0.1\nCLUSTER_IFACE=lo\n"


def served(project: Path, profile: str, dotenv: str = "") -> tuple[list[str], dict]:
    """The dry-run argv of the profile's server, with the environment compose gives it."""
    if profile.startswith("cluster"):
        dotenv += LINK if profile == "cluster-head" else LINK.replace("1\n", "2\n", 1)
    (project / ".env").write_text(dotenv)
    args = ("--profile", profile) if profile else ()
    service, launcher, image = SERVERS[profile]
    config = compose_config(project, None, *args)["services"][service]
    assert config["entrypoint"] == [
        f"/opt/sparkserve/{'mtp_' if launcher == 'mtp' else ''}serve.sh"
    ]
    given = {k: v for k, v in config["environment"].items() if v is not None}
    # the environment of the service's container: its image's mark, compose's knobs
    unset = ("OS_RESERVE_GB", "HF_OFFLINE", "HOST")
    env = {k: v for k, v in launcher_env().items() if k not in unset}
    env.update(given, DRY_RUN="1", **{IMAGE_ENV: image})
    return dry_run_argv(launcher, env), given


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def speculative(argv: list[str]) -> dict | None:
    flag = "--speculative-config"
    return json.loads(value(argv, flag)) if flag in argv else None


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "docker-compose.yml").write_text((REPO / "docker-compose.yml").read_text())
    return tmp_path


@pytest.mark.parametrize("profile", sorted(SERVERS))
def test_each_service_serves_its_launchers_and_images_defaults(profile: str, project: Path) -> None:
    argv, given = served(project, profile)
    _, launcher, image = SERVERS[profile]
    # compose passes only what was set: the .env's link knobs, and the pair service's role
    pair = set()
    if profile.startswith("cluster"):
        pair = {"CLUSTER_NODES", "CLUSTER_RANK", "CLUSTER_HEAD_ADDR", "CLUSTER_IFACE"}
    if profile == "cluster-head":
        pair.add("HOST")  # the host's network: bind where compose would publish
    assert set(given) == pair
    defaults = resolve_settings({IMAGE_ENV: image, **given}, launcher)
    expected = vllm_command(defaults, "0.33.0", hybrid=True).argv
    assert [a for a in argv if a not in ("--mamba-cache-mode", "align")] == [
        a for a in expected if a not in ("--mamba-cache-mode", "align")
    ]
    spec = speculative(argv)
    if image == "cpu":
        assert spec is None and value(argv, "--model") == "Qwen/Qwen3-0.6B"
        assert value(argv, "--kv-cache-memory-bytes") == str(2 * GIB)
        assert value(argv, "--tool-call-parser") == "hermes"
    elif launcher == "mtp":
        assert spec == {"method": "mtp", "num_speculative_tokens": 2}, "MTP drafts 2 tokens"
    else:
        assert spec is not None and spec["method"] == "dflash"
        assert spec["num_speculative_tokens"] == 12
        assert value(argv, "--model") == "Intel/Qwen3.5-122B-A10B-int4-AutoRound"


def test_a_dotenv_sets_knobs_for_every_service_alike(project: Path) -> None:
    dotenv = "NUM_SPEC_TOKENS=5\nMAX_NUM_SEQS=4\nTOOL_PARSER=\n"
    for profile in sorted(SERVERS):
        argv, _ = served(project, profile, dotenv)
        assert value(argv, "--max-num-seqs") == "4", profile
        assert "--tool-call-parser" not in argv, profile
        spec = speculative(argv)
        assert spec is not None and spec["num_speculative_tokens"] == 5, profile


def test_a_knob_set_to_its_registry_default_wins_over_the_recipe(project: Path) -> None:
    registry_model = BY_NAME["MODEL"].default
    argv, _ = served(project, "mtp", f"RECIPE=qwen3.6-35b-a3b\nMODEL={registry_model}\n")
    assert value(argv, "--model") == registry_model
    assert value(argv, "--served-model-name") == "qwen3.6-35b-a3b", "the rest is the recipe's"


def test_a_recipe_under_the_mtp_profile_gets_its_mtp_values(project: Path) -> None:
    argv, _ = served(project, "mtp", "RECIPE=qwen3-coder-next-fp8\n")
    recipe = RECIPES["qwen3-coder-next-fp8"].knobs_for("mtp")
    assert value(argv, "--model") == recipe["MODEL"]
    assert speculative(argv) == {
        "method": "mtp",
        "num_speculative_tokens": int(recipe["NUM_SPEC_TOKENS"]),
    }
    assert value(argv, "--max-model-len") == recipe["MAX_MODEL_LEN"]
