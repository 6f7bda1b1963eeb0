"""schemathesis hooks for tests/e2e/test_bad_requests.py (loaded by the schemathesis CLI in its
own venv through SCHEMATHESIS_HOOKS, never imported by the suite).

Every generated request asks for at most GEN_CAP tokens: a missing or large max_tokens means
"as long as the context allows", thousands of tokens on the CPU, which would spend the run's
time on a few valid generations instead of many bad requests. A max_tokens past the limit is
sent on its own by the test (it must be refused with a 400)."""

from __future__ import annotations

from typing import Any

import schemathesis

GEN_CAP = 16
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for key in LENGTH_FIELDS:
        value = body.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value > GEN_CAP:
            body[key] = GEN_CAP
