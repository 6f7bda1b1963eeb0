"""How every knob's value is resolved (sparkserve.launch.settings): the layers in their order, what
counts as set, the typed values and what is derived from them once."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from sparkserve.knobs.registry import IMAGE_ENV, LAUNCHERS, KnobError, knobs_for
from sparkserve.launch.settings import (
    check_recipe_fits,
    decode_rows,
    resolve_settings,
    tool_settings,
)
from sparkserve.launch.vllm_command import allowed_hosts
from sparkserve.memory.host import GIB
from sparkserve.recipes import RecipeError

CPU = {IMAGE_ENV: "cpu"}
REPO = Path(__file__).resolve().parents[2]


def test_each_layer_wins_over_the_one_below_it() -> None:
    """registry < image (cpu) < launcher (mtp) < recipe < user < option."""
    assert resolve_settings({}, "dflash").layer["NUM_SPEC_TOKENS"] == "registry"
    cpu = resolve_settings(CPU, "dflash")
    assert cpu.text["NUM_SPEC_TOKENS"] == "0" and cpu.layer["NUM_SPEC_TOKENS"] == "image"
    mtp_on_cpu = resolve_settings(CPU, "mtp")
    assert mtp_on_cpu.text["NUM_SPEC_TOKENS"] == "2"
    assert mtp_on_cpu.layer["NUM_SPEC_TOKENS"] == "launcher"
    # qwen3.6-35b-a3b: an mtp recipe that sets NUM_SPEC_TOKENS to 2 and its own model
    recipe = resolve_settings({**CPU, "RECIPE": "qwen3.6-35b-a3b"}, "mtp")
    assert recipe.text["MODEL"] == "Qwen/Qwen3.6-35B-A3B" and recipe.layer["MODEL"] == "recipe"
    assert recipe.layer["KV_CACHE_GB"] == "image", "a knob the recipe leaves keeps its default"
    user = resolve_settings({"RECIPE": "qwen3.6-35b-a3b", "MODEL": "/m"}, "mtp")
    assert user.text["MODEL"] == "/m" and user.layer["MODEL"] == "user"
    option = resolve_settings({"MODEL": "/m"}, "mtp", given={"MODEL": "/o"})
    assert option.text["MODEL"] == "/o" and option.layer["MODEL"] == "option"


def test_a_value_equal_to_a_default_is_set_and_wins_over_the_recipe() -> None:
    # the recipe serves a 262144-token context; the registry default is 262144 as well, so
    # take a knob where they differ: the recipe's MODEL against the registry's MODEL
    registry_model = resolve_settings({}, "mtp").text["MODEL"]
    settings = resolve_settings({"RECIPE": "qwen3.6-35b-a3b", "MODEL": registry_model}, "mtp")
    assert registry_model == settings.values.MODEL and settings.layer["MODEL"] == "user"
    # and NUM_SPEC_TOKENS=12 (dflash's default) under the mtp launcher stays 12
    assert resolve_settings({"NUM_SPEC_TOKENS": "12"}, "mtp").text["NUM_SPEC_TOKENS"] == "12"


def test_empty_is_set_only_where_the_knob_allows_empty() -> None:
    assert resolve_settings({"PORT": " "}).text["PORT"] == "8000"
    assert resolve_settings({"PORT": ""}).layer["PORT"] == "registry"
    assert resolve_settings({"TOOL_PARSER": ""}).text["TOOL_PARSER"] == ""
    assert resolve_settings({"TOOL_PARSER": ""}).layer["TOOL_PARSER"] == "user"
    emptied = resolve_settings({"TOOL_PARSER": "hermes"}, given={"TOOL_PARSER": ""})
    assert emptied.text["TOOL_PARSER"] == ""
    assert resolve_settings({"PORT": "9000"}, given={"PORT": ""}).text["PORT"] == "9000"
    assert resolve_settings({}).text["TOOL_PARSER"] == "qwen3_xml"


def test_bad_values_from_any_layer_are_one_line() -> None:
    with pytest.raises(KnobError, match=r"^PORT='0': must be an integer from 1 to 65535$"):
        resolve_settings({}, given={"PORT": "0"})
    with pytest.raises(KnobError, match=r"^PORT='65536': must be an integer from 1 to 65535$"):
        resolve_settings({"PORT": "65536"})
    with pytest.raises(KnobError, match=r"^SPARKSERVE_IMAGE='tpu': must be one of spark, cpu$"):
        resolve_settings({IMAGE_ENV: "tpu"})
    with pytest.raises(RecipeError, match=r"^RECIPE=qwen3.6-35b-a3b: serves with mtp_serve.sh"):
        resolve_settings({"RECIPE": "qwen3.6-35b-a3b"}, "dflash")
    with pytest.raises(RecipeError, match=r"^RECIPE='nope': no such recipe; one of "):
        resolve_settings({"RECIPE": "nope"})
    assert resolve_settings({"PORT": " 65535 "}).text["PORT"] == "65535"


def test_each_launcher_gets_its_knobs_and_only_those() -> None:
    for launcher in LAUNCHERS:
        settings = resolve_settings({}, launcher)
        assert list(settings.text) == [knob.name for knob in knobs_for(launcher)]
    # a compose-only knob is compose's to read: a bad one never stops the launcher
    assert "MODEL_CACHE" not in resolve_settings({"MODEL_CACHE": "not a cache!"}).text


def test_every_knob_a_launcher_reads_has_one_typed_value() -> None:
    """Settings.values (knobs/values.py, generated from the registry) holds each knob the
    launcher reads as its kind's type, parsed once; None where the launcher does not read it
    or an empty number leaves it unset."""
    kinds = {"int": int, "float": float, "bool": bool, "choice": str, "text": str}
    for launcher in LAUNCHERS:
        settings = resolve_settings({"KV_CACHE_GB": "2.5", "GUARD_FLOOR_GB": "3"}, launcher)
        read = {knob.name: knob for knob in knobs_for(launcher)}
        for field in fields(settings.values):
            value = getattr(settings.values, field.name)
            if field.name not in read:
                assert value is None, (launcher, field.name)
            else:
                assert type(value) is kinds[read[field.name].kind], (launcher, field.name)
        assert set(read) <= {field.name for field in fields(settings.values)}
    mtp = resolve_settings({"KV_CACHE_GB": "", "GUARD_FLOOR_GB": "3", "TOOL_PARSER": ""}, "mtp")
    assert mtp.values.DRAFT_MODEL is None and mtp.values.KV_CACHE_GB is None
    assert mtp.values.GUARD_FLOOR_GB == 3.0 and mtp.values.TOOL_PARSER == ""


def test_typed_values_and_what_is_derived_from_them() -> None:
    cpu = resolve_settings({**CPU, "MAX_NUM_SEQS": "8"}, "dflash")
    assert cpu.values.MAX_NUM_SEQS == 8 and cpu.values.GPU_MEM == 0.5
    assert cpu.kv_cache_bytes == 2 * GIB and not cpu.speculating and not cpu.values.GUARD_RESUME
    assert cpu.lmhead_rows == 8, "no drafter: one row a request"
    spark = resolve_settings({}, "dflash")
    assert spark.kv_cache_bytes is None and spark.speculating
    assert spark.lmhead_rows == decode_rows(3, 12) == 39
    assert resolve_settings({}, "mtp").lmhead_rows == 9
    assert spark.vllm_share_bytes(100 * GIB) == int(0.82 * 100 * GIB)
    assert spark.models() == [
        ("MODEL", "Intel/Qwen3.5-122B-A10B-int4-AutoRound"),
        ("DRAFT_MODEL", "z-lab/Qwen3.5-122B-A10B-DFlash"),
    ]
    assert [knob for knob, _ in resolve_settings({}, "mtp").models()] == ["MODEL"]
    assert resolve_settings({"NUM_SPEC_TOKENS": "0"}).models() == [spark.models()[0]]


def test_a_recipe_that_cannot_fit_is_refused_only_with_its_own_model() -> None:
    small = 24 * GIB
    picked = resolve_settings({"RECIPE": "qwen3.5-122b-a10b"}, "dflash")
    with pytest.raises(RecipeError, match=r"^RECIPE=qwen3.5-122b-a10b: its weights \("):
        check_recipe_fits(picked, small)
    check_recipe_fits(picked, int(119.7 * GIB))
    check_recipe_fits(resolve_settings({"RECIPE": "qwen3.5-122b-a10b", "MODEL": "/m"}), small)
    check_recipe_fits(resolve_settings({}, "dflash"), small)  # no recipe picked


def test_host_tools_take_the_recipes_first_launcher() -> None:
    assert tool_settings({"RECIPE": "qwen3.6-35b-a3b"}).launcher == "mtp"
    assert tool_settings({}).launcher == "dflash"
    assert tool_settings({}, given={"CLUSTER_NODES": "2"}).pair


def test_an_api_published_beyond_loopback_needs_a_key() -> None:
    """BIND_ADDRESS is what compose publishes (and a pair's head binds): beyond loopback it needs
    API_KEY, refused in one line naming the value; a headless worker serves no API."""
    for address in ("0.0.0.0", "192.168.1.20", "::", "spark.local"):
        with pytest.raises(KnobError) as refused:
            resolve_settings({"BIND_ADDRESS": address}, "dflash")
        message = str(refused.value)
        assert f"BIND_ADDRESS={address!r}" in message and "API_KEY" in message
        assert "\n" not in message
        keyed = resolve_settings({"BIND_ADDRESS": address, "API_KEY": "k"}, "dflash")
        assert keyed.text["BIND_ADDRESS"] == address
    for address in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert resolve_settings({"BIND_ADDRESS": address}, "mtp").text["API_KEY"] == ""
    worker = {"BIND_ADDRESS": "10.0.0.2", "CLUSTER_NODES": "2", "CLUSTER_RANK": "1"}
    assert resolve_settings(worker, "dflash").text["BIND_ADDRESS"] == "10.0.0.2"
    with pytest.raises(KnobError):
        resolve_settings({**worker, "CLUSTER_RANK": "0"}, "dflash")


def test_the_middleware_is_told_the_configured_names_and_no_wildcard() -> None:
    """SPARKSERVE_ALLOWED_HOSTS (sparkserve.launch.vllm_command): BIND_ADDRESS, HOST and
    ALLOWED_HOSTS' names, wildcards left out (0.0.0.0 is no name a client asks by); * passes on."""
    assert allowed_hosts(resolve_settings({}, "dflash")) == "127.0.0.1"
    given = {"BIND_ADDRESS": "0.0.0.0", "API_KEY": "k", "ALLOWED_HOSTS": "spark.local,10.0.0.2"}
    assert allowed_hosts(resolve_settings(given, "dflash")) == "spark.local,10.0.0.2"
    given = {"HOST": "10.0.0.1", "BIND_ADDRESS": "10.0.0.1", "API_KEY": "k"}
    assert allowed_hosts(resolve_settings(given, "mtp")) == "10.0.0.1"
    assert allowed_hosts(resolve_settings({"ALLOWED_HOSTS": "*"}, "dflash")) == "*"
