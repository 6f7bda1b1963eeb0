"""The bench's prompts (sparkserve.client.prompts): seeded, so two runs send the same bytes;
each kind well formed; the long prefix of the asked length, opened by its nonce."""

from __future__ import annotations

import ast
import json
import random

import pytest

from sparkserve.client.prompts import (
    KINDS,
    TOOLS,
    agent_prompt,
    code_prompt,
    long_prefix,
    prompt,
    prose_paragraph,
)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_the_same_text_every_run_and_differs_by_variant(kind: str) -> None:
    first = [prompt(kind, variant) for variant in range(4)]
    assert first == [prompt(kind, variant) for variant in range(4)]
    assert len(set(first)) == 4


def test_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValueError) as refused:
        prompt("poetry", 0)
    assert str(refused.value) == "prompt kind 'poetry': must be one of prose, code, agent"


def test_prose_variants_differ_in_their_story_not_only_in_their_number() -> None:
    stories = [prompt("prose", variant).split("\n\nVariant")[0] for variant in range(3)]
    assert len(set(stories)) == 3
    assert all(story.count("\n\n") == 2 for story in stories)  # three paragraphs


@pytest.mark.parametrize("sentences", [0, 1, 6])
def test_prose_paragraph_has_the_asked_number_of_sentences(sentences: int) -> None:
    text = prose_paragraph(random.Random(3), sentences)
    parts = [part for part in text.split(". ") if part]
    assert len(parts) == sentences
    assert text == "" or (text.endswith(".") and text[0].isupper())
    assert text == prose_paragraph(random.Random(3), sentences)  # seeded: same text


def test_code_prompt_is_python_that_compiles_once_the_open_method_has_a_body() -> None:
    text = code_prompt(5)
    assert text.startswith("# Variant 5\n")
    assert text.endswith("def submit(self, job: Job) -> None:\n")
    tree = ast.parse(text.split("```python\n", 1)[1] + "        pass\n")
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes == ["Job", "Scheduler"]


def test_agent_prompt_embeds_the_tools_and_the_history_as_json() -> None:
    text = agent_prompt(2)
    tools_text = text.split("using these tools:\n", 1)[1].split("\n\nThe conversation", 1)[0]
    assert json.loads(tools_text) == TOOLS
    history_text = text.split("as JSON:\n", 1)[1].split("\n\nNext tool calls:", 1)[0]
    history = json.loads(history_text)
    assert history[0] == {"role": "user", "content": "Task 2: the scheduler drops retried jobs."}
    names = {tool["name"] for tool in TOOLS}
    calls = [call for turn in history for call in turn.get("tool_calls", [])]
    assert calls and all(call["name"] in names for call in calls)  # only tools it was given
    assert text.endswith("Next tool calls:\n")


@pytest.mark.parametrize("chars", [len("Document abc123.\n"), 18, 4000, 20_000])
def test_long_prefix_has_exactly_the_asked_length(chars: int) -> None:
    assert len(long_prefix(chars, "abc123")) == chars


@pytest.mark.parametrize("chars", [0, 5, 16])
def test_long_prefix_never_cuts_its_nonce(chars: int) -> None:
    assert long_prefix(chars, "abc123") == "Document abc123.\n"


def test_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^long_prefix: chars=-5: must be 0 or more$"):
        long_prefix(-5, "n")


def test_long_prefix_opens_with_its_nonce_and_shares_its_body() -> None:
    one, other = long_prefix(4000, "one"), long_prefix(4000, "other")
    assert one.startswith("Document one.\n") and other.startswith("Document other.\n")
    body = one.removeprefix("Document one.\n")
    assert other.removeprefix("Document other.\n") == body[: 4000 - len("Document other.\n")]
    assert long_prefix(1000, "one") == one[:1000]  # a shorter prefix is the same text, cut
    assert long_prefix(4000, "one") == one
