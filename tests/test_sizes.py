"""The size limits of DEVELOPERS' standards, by an AST scan of src/exactlens: no module over 700 lines and no
function (or method) over 100 lines, so that a newcomer can read any unit in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "exactlens"
MAX_MODULE, MAX_FUNCTION = 700, 100


def test_no_module_is_over_700_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE}
    assert long == {}


def test_no_function_is_over_100_lines() -> None:
    long = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # decorators not counted, the docstring counted
                if length > MAX_FUNCTION:
                    long[f"{path.relative_to(SRC)}:{node.name}"] = length
    assert long == {}
