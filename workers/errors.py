"""The text a failed trial stores: the error and what caused it.

Triton raises a ``CompilationError`` that points at the failing line of the outermost kernel
and keeps the real reason (the error inside a called ``@triton.jit`` helper) as its cause, so
storing only the outer text loses why a config cannot compile.
"""

from __future__ import annotations

import traceback

ERROR_TEXT_LIMIT = 4000


def error_text(exc: BaseException) -> str:
    """``exc`` and its chain of causes, innermost last, at most ERROR_TEXT_LIMIT characters (its end kept)."""
    parts = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append("".join(traceback.format_exception_only(exc)).strip())
        exc = exc.__cause__ or exc.__context__
    return "\ncaused by: ".join(parts)[-ERROR_TEXT_LIMIT:]
