"""The package type-checks under ``mypy --strict`` (config in setup.cfg)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean() -> None:
    """mypy --strict reports no error in imexctl/."""
    if importlib.util.find_spec("mypy") is None:
        unavailable("mypy is not installed (the 'test' extra: bash .ci/setup test)")
    # no cache: the checkout may not be writable (the fast tests also run as an unprivileged user)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir=/dev/null"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
