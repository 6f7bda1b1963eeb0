"""The streaming client's reading of vLLM's completion chunks: with return_token_ids each timed
chunk records how many tokens it carried (several with speculative decoding), a chunk of
tokens whose text is empty included; the closing chunk with no tokens is not a token chunk."""

from __future__ import annotations

from sparkserve.client.server import StreamResult, _take_chunk


def chunk(text: str, token_ids: list[int] | None, finish: str | None = None) -> dict:
    choice: dict = {"index": 0, "text": text, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"choices": [choice]}


def test_each_chunk_records_the_tokens_it_carried() -> None:
    result = StreamResult(started=0.0)
    _take_chunk(result, chunk(" w17", [17]), 1.0)
    _take_chunk(result, chunk(" w20 w21 w22", [20, 21, 22]), 2.0)
    _take_chunk(result, chunk("", [2, 0], "length"), 3.0)  # special tokens: no text
    _take_chunk(result, chunk("", [], "length"), 4.0)  # the closing chunk
    assert result.chunk_tokens == [1, 3, 2] and result.chunk_times == [1.0, 2.0, 3.0]
    assert result.chunks == 3 and result.finish_reason == "length"


def test_without_token_ids_no_counts_are_recorded() -> None:
    result = StreamResult(started=0.0)
    _take_chunk(result, chunk(" w17", None), 1.0)
    _take_chunk(result, chunk("", None, "stop"), 2.0)
    assert result.chunk_tokens == [] and result.chunk_times == [1.0]
