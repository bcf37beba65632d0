"""The packages' shell scripts (the version switch, the interpreter wrapper, the Debian maintainer scripts) pass
shellcheck; tests/test_packaging.py runs them in a clean Debian root (marker packaging)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = (
    "pkg/imexctl-switch",
    "pkg/python3-wrapper",
    "debian/imexctl.postinst",
    "debian/imexctl.prerm",
    "debian/imexctl.postrm",
)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("name", SCRIPTS)
def test_shellcheck_is_clean(name: str) -> None:
    """shellcheck (as POSIX sh) finds nothing in the script."""
    done = subprocess.run(
        ["shellcheck", "--shell=sh", str(REPO / name)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
