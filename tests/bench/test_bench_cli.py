"""`sparkserve bench`'s own input checks (a run against a real server:
tests/e2e/test_bench_server.py)."""

from __future__ import annotations

import pytest

from sparkserve.client.prompts import parse_kinds
from sparkserve.command_line import UsageError


@pytest.mark.parametrize("text", ["", "poetry", "prose,prose", "code,"])
def test_bad_kinds(text: str) -> None:
    with pytest.raises(UsageError, match="must be some of prose,code,agent"):
        parse_kinds(text)
