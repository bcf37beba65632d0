"""The tree is formatted and lint-clean (ruff, configured in ruff.toml), and functions stay short."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 40
#: a function may be longer when its ``def`` line (or the line above) says why
LONG_MARK = "# long:"


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("ruff") is None:
        unavailable("ruff is not installed (the 'test' extra: bash .ci/setup test)")
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


#: what building the wheel, the sdist, the .deb and the .rpm leaves in the tree
BUILD_OUTPUTS = (
    "dist/imexctl-0.1.0.tar.gz",
    "sdist/imexctl-0.1.0-py3-none-any.whl",
    "imexctl-0.1.0-py3-none-any.whl",
    "build/lib/imexctl/cli/__init__.py",
    "imexctl.egg-info/PKG-INFO",
    "wheelhouse/psutil-6.0.0-cp36-abi3-manylinux_2_17_aarch64.whl",
    "imexctl_0.1.0_arm64.deb",
    "imexctl_0.1.0_arm64.buildinfo",
    "imexctl_0.1.0_arm64.changes",
    "imexctl-0.1.0-1.aarch64.rpm",
    "debian/imexctl/opt/imexctl/pyvenv.cfg",
    "debian/.debhelper/generated/imexctl/installed-by-dh_installdocs",
    "debian/debhelper-build-stamp",
    "debian/files",
    "debian/imexctl.substvars",
    "debian/imexctl.postrm.debhelper",
)


def test_no_build_output_is_tracked() -> None:
    """No wheel, sdist, package or staging tree is committed (a stale wheel once was)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60)
    built = (".whl", ".tar.gz", ".deb", ".rpm", ".buildinfo", ".changes")
    assert not [name for name in tracked.stdout.splitlines() if name.endswith(built)]


@pytest.mark.parametrize("path", BUILD_OUTPUTS)
def test_build_outputs_are_ignored(path: str) -> None:
    """.gitignore keeps each build output out of git add."""
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO, check=False, timeout=60)
    assert done.returncode == 0, f"{path} is not ignored"


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
