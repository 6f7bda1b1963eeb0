"""The knob registry (sparkserve.knobs.registry): each rule a knob may carry, the one-line
refusal and the defaults per launcher and image (how a value is resolved:
tests/launch/test_settings.py)."""

from __future__ import annotations

import re

import pytest

from sparkserve.knobs.registry import (
    BY_NAME,
    GROUP_TITLES,
    IMAGE_ENV,
    IMAGES,
    KNOBS,
    LAUNCHERS,
    Image,
    Knob,
    KnobError,
    Launcher,
    image_of,
    knobs_for,
)
from sparkserve.launch.settings import resolve_settings

# Small knobs, one per rule: the registry's own knobs are checked through them and below.
COUNT = Knob("COUNT", "int", "3", why="w", group="g", minimum=1, maximum=16)
SHARE = Knob("SHARE", "float", "0.5", why="w", group="g", minimum=0.1, maximum=4)
SWITCH = Knob("SWITCH", "bool", "0", why="w", group="g")
MODE = Knob("MODE", "choice", "a", why="w", group="g", choices=("a", "b"))
BACKEND = Knob("BACKEND", "choice", "", why="w", group="g", choices=("", "x", "y"), empty_ok=True)
ARGS = Knob("ARGS", "text", "", why="w", group="g", shell_words=True, empty_ok=True)
WORD = Knob("WORD", "text", "abc", why="w", group="g", pattern=r"[a-z]+")
NOTE = Knob("NOTE", "text", "", why="w", group="g")
TOKEN = Knob("TOKEN", "text", "", why="w", group="g", pattern=r"\S+", empty_ok=True, secret=True)
TIERED = Knob("TIERED", "int", "12", why="w", group="g", mtp_default="2", cpu_default="0")
MTP_ONLY = Knob("MTP_ONLY", "int", "12", why="w", group="g", mtp_default="2")


def test_registry_defaults_are_the_documented_ones() -> None:
    dflash, mtp = resolve_settings({}, "dflash").text, resolve_settings({}, "mtp").text
    assert dflash["GPU_MEM"] == "0.82" and dflash["OS_RESERVE_GB"] == "14"
    assert dflash["MAX_BATCHED_TOKENS"] == "8192" and dflash["MAX_NUM_SEQS"] == "3"
    assert dflash["MAX_MODEL_LEN"] == "262144" and dflash["PREFIX_CACHE"] == "1"
    assert dflash["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"
    assert dflash["SPARK_KEEP_BF16_LMHEAD"] == "0" and dflash["PORT"] == "8000"
    assert dflash["NUM_SPEC_TOKENS"] == "12" and mtp["NUM_SPEC_TOKENS"] == "2"
    assert dflash["TOOL_PARSER"] == "qwen3_xml" and dflash["REASONING_PARSER"] == "qwen3"
    assert dflash["LOAD_FORMAT"] == "fastsafetensors"
    assert "DRAFT_MODEL" not in mtp
    for knob in KNOBS:
        assert knob.why.strip(), knob.name
        assert knob.check(knob.default) == knob.default, knob.name


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_default_of_every_launcher_and_image_passes_its_own_rule(
    launcher: Launcher, image: Image
) -> None:
    for knob in KNOBS:
        default = knob.default_for(launcher, image)
        assert knob.check(default) == default, (knob.name, launcher, image)


def test_the_registry_is_consistent() -> None:
    assert len(BY_NAME) == len(KNOBS), "knob names are unique"
    for knob in KNOBS:
        assert knob.group in GROUP_TITLES, knob.name
        assert knob.launchers and set(knob.launchers) <= set(LAUNCHERS), knob.name
        if knob.kind in ("int", "float"):
            assert knob.minimum is not None and knob.maximum is not None, knob.name
            assert knob.minimum <= knob.maximum, knob.name
        if knob.kind == "choice":
            assert [c for c in knob.choices if c], knob.name


def test_the_mtp_launchers_default_wins_over_the_cpu_images() -> None:
    assert TIERED.default_source("dflash") == ("12", "registry")
    assert TIERED.default_source("mtp") == ("2", "launcher")
    assert TIERED.default_source("dflash", "cpu") == ("0", "image")
    assert TIERED.default_source("mtp", "cpu") == ("2", "launcher")
    # no cpu default: the cpu image takes the launcher's
    assert MTP_ONLY.default_for("mtp", "cpu") == "2"
    assert MTP_ONLY.default_for("dflash", "cpu") == "12"
    assert BY_NAME["MODEL"].default_source("mtp", "cpu") == ("Qwen/Qwen3-0.6B", "image")


@pytest.mark.parametrize(
    ("knob", "allowed"),
    [
        (COUNT, "an integer from 1 to 16"),
        (SHARE, "a number from 0.1 to 4"),
        (Knob("OPEN", "float", "1", why="w", group="g", minimum=0), "a number from 0 to any"),
        (SWITCH, "0 or 1"),
        (Knob("SWITCH", "bool", "0", why="w", group="g", empty_ok=True), "0 or 1"),
        (MODE, "one of a, b"),
        (BACKEND, "one of x, y, or empty"),
        (ARGS, "arguments quoted as in a shell (balanced quotes), or empty"),
        (WORD, "text matching [a-z]+"),
        (NOTE, "any text"),
        (TOKEN, r"text matching \S+, or empty"),
    ],
    ids=lambda case: case.name if isinstance(case, Knob) else None,
)
def test_allowed_says_the_rule_in_words(knob: Knob, allowed: str) -> None:
    assert knob.allowed() == allowed


@pytest.mark.parametrize(
    ("knob", "value", "normalised"),
    [
        (COUNT, "1", "1"),  # both ends of a range are inside it
        (COUNT, "16", "16"),
        (COUNT, " 7\n", "7"),
        (COUNT, "08", "8"),  # an int leaves in its plain form: bash reads 08 as octal
        (COUNT, "016", "16"),
        (SHARE, "0.1", "0.1"),
        (SHARE, "4", "4"),
        (SHARE, "1e-1", "1e-1"),
        (SHARE, ".5", ".5"),
        (SWITCH, "1", "1"),
        (SWITCH, "0", "0"),
        (MODE, " b ", "b"),
        (BACKEND, "", ""),
        (BACKEND, "  ", ""),
        (ARGS, "--seed '4 2' --x \"a b\"", "--seed '4 2' --x \"a b\""),
        (WORD, "abc", "abc"),
        (NOTE, "anything at all, even 'quotes", "anything at all, even 'quotes"),
        (NOTE, "", ""),
        (TOKEN, "", ""),
        (TOKEN, "s3cr3t", "s3cr3t"),
    ],
)
def test_check_accepts_what_the_rule_allows_and_strips_it(
    knob: Knob, value: str, normalised: str
) -> None:
    assert knob.check(value) == normalised


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        (COUNT, "0"),  # just outside a range is outside it
        (COUNT, "17"),
        (COUNT, "1.5"),
        (COUNT, "1e1"),
        (COUNT, "+2"),  # Python's int() reads these; the launchers' shell and JSON do not
        (COUNT, "1_0"),
        (COUNT, "\u0663"),  # ARABIC-INDIC DIGIT THREE
        (SHARE, "+0.5"),
        (SHARE, "0_5"),
        (COUNT, ""),
        (SHARE, "0.09"),
        (SHARE, "4.01"),
        (SHARE, "nan"),
        (SHARE, "inf"),
        (SHARE, "-inf"),
        (SWITCH, "true"),
        (SWITCH, ""),
        (MODE, "A"),
        (MODE, ""),
        (BACKEND, "z"),
        (ARGS, "--flag 'unbalanced"),
        (WORD, "abc1"),  # the whole value must match, not a part of it
        (WORD, ""),
    ],
)
def test_check_refuses_in_one_line_naming_knob_value_and_rule(knob: Knob, value: str) -> None:
    with pytest.raises(KnobError) as refused:
        knob.check(value)
    message = str(refused.value)
    assert message == f"{knob.name}={value.strip()!r}: must be {knob.allowed()}"
    assert "\n" not in message


def test_a_secret_is_never_in_its_refusal() -> None:
    with pytest.raises(KnobError, match=re.escape(r"TOKEN=<hidden>: must be text matching \S+")):
        TOKEN.check("s3cr3t with spaces")
    with pytest.raises(KnobError) as refused:
        BY_NAME["API_KEY"].check("s3cr3t key")
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OS_RESERVE_GB", "3", "OS_RESERVE_GB='3': must be a number from 4 to 64"),
        ("NUM_SPEC_TOKENS", "17", "NUM_SPEC_TOKENS='17': must be an integer from 0 to 16"),
        ("KV_CACHE_GB", "0.2", "KV_CACHE_GB='0.2': must be a number from 0.25 to 512, or empty"),
        (
            "DRAFT_ATTENTION_BACKEND",
            "XFORMERS",
            "DRAFT_ATTENTION_BACKEND='XFORMERS': must be one of FLASH_ATTN, FLASHINFER, "
            "TRITON_ATTN, FLEX_ATTENTION, or empty",
        ),
        ("HF_HOME", "relative/path", r"HF_HOME='relative/path': must be text matching /\S*"),
        ("CLUSTER_HEAD_ADDR", "head", "CLUSTER_HEAD_ADDR='head': must be text matching "),
    ],
)
def test_registry_refusals_read_as_the_docs_say(name: str, value: str, message: str) -> None:
    with pytest.raises(KnobError) as refused:
        BY_NAME[name].check(value)
    assert str(refused.value).startswith(message)


def test_knobs_for_a_launcher_keeps_order_and_leaves_out_compose_and_other_launchers() -> None:
    dflash, mtp = knobs_for("dflash"), knobs_for("mtp")
    container = [knob for knob in KNOBS if knob.scope == "container"]
    assert list(dflash) == container, "every container knob reaches dflash, in registry order"
    assert [knob.name for knob in container if knob not in mtp] == [
        "DRAFT_MODEL",
        "DRAFT_ATTENTION_BACKEND",
    ]
    compose_only = {knob.name for knob in KNOBS if knob.scope == "compose"}
    # BIND_ADDRESS reaches the launcher too: it refuses a public one without API_KEY
    assert compose_only == {"MODEL_CACHE", "CACHE_UID", "CACHE_GID", "ROUTER_IMAGE"}
    assert not compose_only & {knob.name for knob in dflash + mtp}


@pytest.mark.parametrize(
    ("value", "image"), [(None, "spark"), ("", "spark"), ("  ", "spark"), ("spark", "spark"),
                         ("cpu", "cpu"), (" cpu\n", "cpu")]
)  # fmt: skip
def test_image_of_unset_or_empty_is_the_spark(value: str | None, image: Image) -> None:
    env = {} if value is None else {IMAGE_ENV: value}
    assert image_of(env) == image


@pytest.mark.parametrize("value", ["gpu", "CPU", "spark cpu"])
def test_image_of_an_unknown_image_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(KnobError) as refused:
        image_of({IMAGE_ENV: value})
    assert str(refused.value) == f"SPARKSERVE_IMAGE={value!r}: must be one of spark, cpu"
