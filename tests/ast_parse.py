"""``ast.parse`` that survives CPython 3.11.7's spurious AST SystemError.

In CPython 3.11 before the fix of python/cpython#106905, the AST constructor
keeps its recursion depth in interpreter-wide state. When another thread of the
test process builds an AST at the same moment, the depth seen at the end no
longer matches the start and ``ast.parse`` raises ``SystemError: AST
constructor recursion depth mismatch`` for valid source. Parsing is pure, so a
retry is sound; any other error (a real ``SyntaxError`` included) propagates.
"""

from __future__ import annotations

import ast

_SPURIOUS = "AST constructor recursion depth mismatch"


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(5):
        try:
            return ast.parse(source, filename)
        except SystemError as e:
            if _SPURIOUS not in str(e) or attempt == 4:
                raise
    raise AssertionError("unreachable")
