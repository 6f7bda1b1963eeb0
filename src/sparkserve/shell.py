"""Text that bash reads back exactly: single-quoted words and array assignments."""

from __future__ import annotations


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def bash_array(name: str, words: list[str] | tuple[str, ...]) -> str:
    return f"{name}=({' '.join(shell_quote(word) for word in words)})"
