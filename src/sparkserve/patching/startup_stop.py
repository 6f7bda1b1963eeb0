"""startup-stop: a stop (SIGTERM) while the engine starts must stop vLLM, not be swallowed.

Until uvicorn runs, vLLM's API server turns SIGTERM into KeyboardInterrupt (run_server's
`_interrupt_init`). While the engine core starts (model load, KV-cache profiling: minutes for
a 122B model) the API server waits inside `zmq_socket_ctx`, which catches KeyboardInterrupt,
logs it at debug level and goes on: the stop is lost, the server comes up anyway, and `docker
stop` ends only by SIGKILL when stop_grace_period runs out. Re-raising after the log lets the
interrupt reach the API server's own clean-up, which stops the engine and exits.
"""

from __future__ import annotations

import ast

from sparkserve.patching.engine import (
    Finding,
    LineSpan,
    Patch,
    PatchInfo,
    State,
    statement_lines,
)

FUNCTION = "zmq_socket_ctx"


def _catches_keyboard_interrupt(handler: ast.ExceptHandler) -> bool:
    return isinstance(handler.type, ast.Name) and handler.type.id == "KeyboardInterrupt"


def _only_logs(body: list[ast.stmt]) -> bool:
    """The swallowing handler's body: calls (a log line) and `pass`, nothing else."""
    return all(
        isinstance(stmt, ast.Pass)
        or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call))
        for stmt in body
    )


class StartupStopPatch(Patch):
    info = PatchInfo(
        name="startup-stop",
        target="utils/network_utils.py",
        description=(
            f"{FUNCTION}(): re-raise KeyboardInterrupt after logging it instead of swallowing it."
        ),
        why=(
            "A SIGTERM (docker stop, Ctrl-C) while the engine core starts is lost: the server "
            "comes up anyway and only SIGKILL ends it, stop_grace_period later."
        ),
        upstream="not reported upstream yet (found by sparkserve, 2026-12-05)",
        affected="0.27.1 - 0.34.0 (every release checked)",
        fixed_in="none yet",
    )

    def inspect(self, source: str) -> tuple[Finding, LineSpan | None]:
        where = f"{self.info.target}: {FUNCTION}()"
        function = self.one_function(source, FUNCTION)
        if isinstance(function, Finding):
            return function, None
        handlers = [
            node
            for node in ast.walk(function)
            if isinstance(node, ast.ExceptHandler) and _catches_keyboard_interrupt(node)
        ]
        if not handlers:
            return Finding(
                State.FIXED_UPSTREAM, f"{where} no longer catches KeyboardInterrupt"
            ), None
        if len(handlers) != 1:
            return Finding(
                State.UNRECOGNISED,
                f"expected one 'except KeyboardInterrupt:' in {where}, found {len(handlers)}",
            ), None
        body = handlers[0].body
        if any(isinstance(node, ast.Raise) for stmt in body for node in ast.walk(stmt)):
            return Finding(
                State.FIXED_UPSTREAM, f"{where} re-raises the KeyboardInterrupt it catches"
            ), None
        if not _only_logs(body):
            return Finding(
                State.UNRECOGNISED,
                f"expected the 'except KeyboardInterrupt:' of {where} to only log, found other "
                "statements",
            ), None
        start, end = body[0].lineno - 1, body[-1].end_lineno or body[-1].lineno
        indent, kept = statement_lines(source, start, end)
        detail = f"{where} lines {start + 1}-{end} swallow KeyboardInterrupt"
        return Finding(State.NEEDED, detail), LineSpan(start, end, [*kept, f"{indent}raise\n"])


STARTUP_STOP = StartupStopPatch()
