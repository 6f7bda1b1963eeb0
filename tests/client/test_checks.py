"""The selftest's greedy comparison (a divergence is a failure only where the reference's
choice was clear; elsewhere it is reported with its place and margin) and the unit its prefix
check counts hits in. Its servers are tests/e2e/test_selftest_container.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkserve import command_line as cl
from sparkserve.client.checks import (
    CALL_TEXT,
    CLEAR_MARGIN,
    Probe,
    arguments_fault,
    check_head,
    compare_greedy,
    exit_status,
    hit_unit,
    judge_parsed_call,
    judge_tool_reply,
    literal_regex,
    mark,
)
from sparkserve.client.server import Server


def run(tokens: list[str], tops: list[dict[str, float]]) -> dict:
    return {"tokens": tokens, "top": tops}


REFERENCE = [run(["a", "b", "c"], [{"a": -0.1, "x": -3.0}, {"b": -1.0, "y": -1.05},
                                  {"c": -0.2, "z": -2.5}])]  # fmt: skip


def test_identical_paths_pass() -> None:
    result = compare_greedy("greedy vs plain", [run(["a", "b", "c"], [])], REFERENCE)
    assert (result.ok, result.detail) == (True, "prompt 1: identical")


def test_a_divergence_where_the_reference_hesitated_is_not_tested_never_ok() -> None:
    result = compare_greedy("greedy vs plain", [run(["a", "y", "c"], [])], REFERENCE)
    assert result.ok is None and result.claimed
    assert result.detail == ("not tested: random weights: a divergence cannot be judged; "
                             "prompt 1: token 1, margin 0.050")  # fmt: skip
    assert exit_status([result]) == cl.EXIT_NOT_TESTED


def test_a_divergence_from_a_clear_choice_fails() -> None:
    for token in (0, 2):
        tokens = ["a", "b", "c"]
        tokens[token] = "q"
        result = compare_greedy("greedy vs bf16", [run(tokens, [])], REFERENCE)
        assert result.ok is False, result
        margin = float(result.detail.rsplit(" ", 1)[1])
        assert margin > CLEAR_MARGIN and result.detail.startswith(f"prompt 1: token {token},")


# vLLM 0.33.0's lines on the H200 (docs/data/runs/2026-12-04-selftest-h200.md): the Spark
# geometry with its DFlash drafter, then without a drafter
DFLASH_LOG = """(EngineCore pid=2042) INFO 12-04 17:55:58 [kv_cache_utils.py:865] kv cache group sizes (2240, 2240, 2240, 4480, 2240, 2240, 2240)
(EngineCore pid=2042) INFO 12-04 17:55:58 [kv_cache_utils.py:866] kv lcm block sizes 4480
"""  # noqa: E501
PLAIN_LOG = (
    "(EngineCore pid=832) INFO 12-04 17:51:00 [kv_cache_utils.py:866] kv lcm block sizes 2096\n"
)


def test_prefix_hits_are_counted_in_the_groups_least_common_block() -> None:
    unit, why = hit_unit(DFLASH_LOG, 2240)
    assert unit == 4480
    assert why == ("hits land on 4480-token boundaries (the least common multiple of the KV "
                   "cache groups' blocks, 2240 and 4480)")  # fmt: skip
    assert hit_unit(PLAIN_LOG, 2096) == (2096, "")
    assert hit_unit("", 128) == (128, "")  # one group: vLLM logs no multiple


# The same two lines for the layout the hybrid-page-divide patch gives (the group blocks that
# tests/patching/test_page_divide.py's scenario gets from vLLM's own functions)
DIVIDED_LOG = """(EngineCore pid=2042) INFO 12-06 01:40:00 [kv_cache_utils.py:865] kv cache group sizes (2240, 2240, 2240, 2240, 2240, 2240, 2240, 2240, 1120)
(EngineCore pid=2042) INFO 12-06 01:40:00 [kv_cache_utils.py:866] kv lcm block sizes 2240
"""  # noqa: E501


# vLLM 0.33.0's lines on the H100 of 2026-12-06 (docs/data/runs/2026-12-06-h100-page-divide.md,
# the selftest with hybrid-page-divide applied): vllm:cache_config_info said block_size 1120
# there, and a 1400-token prompt sent again hit 1120 tokens
ALIGN_LINE = ("(EngineCore pid=936) INFO 12-06 12:28:43 [interface.py:1108] Setting attention "
              "block size to 2240 tokens to ensure that attention page size is >= mamba page "
              "size.\n")  # fmt: skip
DIVIDED_GPU_GROUPS = """(EngineCore pid=936) INFO 12-06 12:30:56 [kv_cache_utils.py:865] kv cache group sizes (2240, 2240, 2240, 2240, 1120, 1120, 1120)
(EngineCore pid=936) INFO 12-06 12:30:56 [kv_cache_utils.py:866] kv lcm block sizes 2240
"""  # noqa: E501
DIVIDED_GPU_LOG = ALIGN_LINE + DIVIDED_GPU_GROUPS


def test_sub_block_hits_follow_the_mamba_block_whichever_block_the_metrics_give() -> None:
    """The GPU selftest of the divided layout: the metrics' block was the divisor (1120) and
    the check asked for whole 2240s (the multiple) while hits came in 1120s. The Mamba block
    from vLLM's align line decides: above the divisor, hits come in the divisor; on the stock
    layout (Mamba block 2240 = the divisor) they stay whole multiples."""
    for block in (1120, 2240):
        unit, why = hit_unit(DIVIDED_GPU_LOG, block)
        assert unit == 1120, block
        assert why == ("hits land on 1120-token boundaries (the greatest common divisor of the "
                       "KV cache groups' blocks, 1120 and 2240, below the 2240-token "
                       "GatedDeltaNet block: vLLM's sub-block hits)")  # fmt: skip
    assert hit_unit(ALIGN_LINE + DFLASH_LOG, 2240)[0] == 4480


def test_prefix_hits_below_the_mamba_block_are_counted_in_the_groups_common_divisor() -> None:
    unit, why = hit_unit(DIVIDED_LOG, 2240)
    assert unit == 1120
    assert why == ("hits land on 1120-token boundaries (the greatest common divisor of the KV "
                   "cache groups' blocks, 1120 and 2240: vLLM's sub-block hits)")  # fmt: skip
    # the stock layout's divisor is its cache block: no sub-block hits, the multiple stays
    assert hit_unit(DFLASH_LOG, 2240)[0] == 4480


# The replies of a real vLLM server (tests/client/data/tool_replies.json says which)
REPLIES = json.loads((Path(__file__).parent / "data" / "tool_replies.json").read_text())


def test_the_tool_parser_that_reads_the_models_format_passes_and_one_that_does_not_fails() -> None:
    """The model made to write its own (XML) call: qwen3_xml returns it as set_unit(kelvin);
    hermes, a parser of another format, finds no call in it, and the selftest fails."""
    forced = REPLIES["forced_xml_call"]
    read = judge_parsed_call(forced["qwen3_xml"], "TOOL_PARSER=qwen3_xml")
    assert (read.ok, read.detail) == (True, 'TOOL_PARSER=qwen3_xml: read set_unit({"unit": '
                                            '"kelvin"})')  # fmt: skip
    broken = judge_parsed_call(forced["hermes"], "TOOL_PARSER=hermes")
    assert broken.ok is False and "the parser read no call (finish stop)" in broken.detail
    assert exit_status([read, broken]) == cl.EXIT_FAILED


def test_required_tool_arguments_random_weights_could_not_finish_are_not_tested() -> None:
    """What docs/data/h200_selftest.json recorded as ok, set_unit({}), is not tested: the
    reply was cut at max_tokens (qwen3_xml's grammar holds the tags, not the value), as is
    hermes' endless number; never ok, and claimed by nothing."""
    for parser, fault in (("qwen3_xml", "missing ['unit']"), ("hermes", "content '<tool_call>")):
        result = judge_tool_reply(REPLIES["required"][parser], 128)
        assert result.ok is None and not result.claimed, (parser, result)
        assert result.detail.startswith("not tested: random weights") and fault in result.detail


def test_required_tool_arguments_are_judged_against_the_schema_once_the_reply_ended() -> None:
    def reply(arguments: str | None, finish: str = "tool_calls") -> dict:
        calls = [] if arguments is None else [
            {"function": {"name": "set_unit", "arguments": arguments}}]  # fmt: skip
        return {"choices": [{"message": {"content": "", "tool_calls": calls},
                             "finish_reason": finish}]}  # fmt: skip

    assert judge_tool_reply(reply('{"unit": "kelvin"}'), 128).ok is True
    assert judge_tool_reply(reply(None, "stop"), 128).ok is False  # ended, the parser found none
    assert arguments_fault("{}") == "missing ['unit']"
    assert arguments_fault('{"unit": "rankine"}') == (
        "unit 'rankine' is not one of ['celsius', 'kelvin']"
    )
    assert arguments_fault('{"unit": "kelvin", "x": 1}') == "not in the schema: ['x']"
    assert judge_tool_reply(reply("{}"), 128).ok is None  # not held by a grammar: not judged


def test_the_call_text_regex_matches_exactly_the_call() -> None:
    for text in CALL_TEXT.values():
        assert re.fullmatch(literal_regex(text), text)
        assert not re.fullmatch(literal_regex(text), text + " ")


def test_a_head_the_plugin_kept_bf16_is_not_tested_off_cuda_and_fails_on_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 head switched off behind the settings: the plugin's own report (written by its
    `_log`, as in the server) says it kept bf16. Off CUDA (the CPU, where its calibration may
    choose bf16) a case that claims the int8 head is not tested, "no int8 head ran", exit 5;
    on CUDA, where the int8 head must win, it fails. Never ok."""
    from sparkserve.in_vllm.lmhead import plugin  # torch: imported here, as in the server

    monkeypatch.setenv(plugin.REPORT_ENV, str(tmp_path))
    plugin._log(plugin.HeadReport(path="bf16", reason="calibration: bf16 is faster here"))
    for cuda, outcome, status in ((False, "not tested", cl.EXIT_NOT_TESTED),
                                  (True, "FAILED", cl.EXIT_FAILED)):  # fmt: skip
        probe = Probe(server=Server("http://127.0.0.1:9"), key="", model="m", speculative=False,
                      head_report_dir=tmp_path, int8_head=True, cuda=cuda)  # fmt: skip
        result = check_head(probe)
        assert (mark(result.ok), result.claimed) == (outcome, True), result
        assert exit_status([result]) == status
    assert result.detail == "bf16: calibration: bf16 is faster here"
    off_cuda = check_head(
        Probe(Server("http://127.0.0.1:9"), "", "m", False, tmp_path, True, False)
    )
    assert off_cuda.detail.startswith("not tested: no int8 head ran; bf16: calibration")
