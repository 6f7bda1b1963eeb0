"""The text llama-benchy cuts its prompts from: the book it downloads by default (what Spark
Arena's figures used), or sparkserve's offline corpus, built here and seeded into
llama-benchy's cache (a folder keyed by the md5 of the book URL) so nothing is downloaded."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from sparkserve.client.prompts import prose_paragraph

# llama-benchy 0.4.0's default --book-url (Project Gutenberg's Sherlock Holmes)
BOOK_URL = "https://www.gutenberg.org/files/1661/1661-0.txt"
# the offline corpus's name, passed as llama-benchy's --book-url; a new text gets a new name
OFFLINE_URL = "sparkserve:prose-v1"
CORPORA = ("book", "offline")
# about 150k tokens with a Qwen tokenizer: more than the Arena profile's deepest request, so
# llama-benchy cuts each prompt from one pass over the text, never from a repeat
OFFLINE_CHARS = 700_000


@dataclass(frozen=True)
class Corpus:
    name: str  # book or offline
    url: str  # llama-benchy's --book-url
    sha256: str | None  # of the offline text; the book is whatever the URL serves


def offline_text() -> str:
    rng = random.Random(20261205)
    paragraphs: list[str] = []
    size = 0
    while size < OFFLINE_CHARS:
        paragraphs.append(prose_paragraph(rng))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs)


def cache_file(home: Path, url: str) -> Path:
    """Where llama-benchy 0.4.0 looks for the text of `url` under HOME (corpus.py _load_data)."""
    return home / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"


def prepare(name: str, home: Path | None) -> Corpus:
    """The corpus `name`; the offline one is written into llama-benchy's cache under `home`
    (a folder the run gives llama-benchy as HOME)."""
    if name == "book":
        return Corpus(name, BOOK_URL, None)
    assert home is not None, "the offline corpus needs a HOME to seed"
    text = offline_text()
    target = cache_file(home, OFFLINE_URL)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return Corpus(name, OFFLINE_URL, hashlib.sha256(text.encode()).hexdigest())
