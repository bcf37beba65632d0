"""The tree is formatted and lint-clean (ruff, configured in ruff.toml), and functions stay short."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 40
#: a function may be longer when its ``def`` line (or the line above) says why
LONG_MARK = "# long:"


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ruff", reason="ruff is in the 'test' extra")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ruff_check_is_clean() -> None:
    """ruff's linter reports nothing."""
    done = _ruff("check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    """ruff's formatter would change nothing."""
    done = _ruff("format", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's code, its docstring left out."""
    body = fn.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1
    start = body[1].lineno if has_doc else body[0].lineno
    return (fn.end_lineno or start) - start + 1


def test_no_function_in_the_package_is_long_without_a_reason() -> None:
    """Every function in imexctl/ has at most 40 lines of code, unless a '# long:' comment says why."""
    long = []
    for path in sorted((REPO / "imexctl").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                around = " ".join(lines[max(0, node.lineno - 2) : node.lineno])
                if LONG_MARK not in around:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({_body_lines(node)} lines)")
    assert not long, long
