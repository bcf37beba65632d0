""".ci/venv.sh's make_venv: each requirement reaches pip as one whole line, and a venv is reused only while what
made it still matches (issue 31). Offline: the requirement lines here need nothing from an index. And what a test
does when the machine lacks a prerequisite (tests/support/ci.py).

The fresh machine that runs the whole of ``.ci/setup`` from nothing is tests/test_freshroot.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent
#: a requirement whose marker holds a '<': split into shell words it is the invalid requirement '<'
MARKED = 'tomli>=1.1; python_version < "3.0"'


def make_venv(venv: Path, *lines: str) -> subprocess.CompletedProcess[str]:
    """Run make_venv from .ci/venv.sh as .ci/setup and bench/run do (bash, set -euo pipefail), offline."""
    script = 'set -euo pipefail; . .ci/venv.sh; make_venv "$@"'
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(venv.parent), "PIP_NO_INDEX": "1"}
    env |= {k: v for k, v in os.environ.items() if k == "TMPDIR"}
    return subprocess.run(
        ["bash", "-c", script, "make_venv", str(venv), *lines],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_venv_is_reused_only_while_its_requirement_lines_and_interpreter_match(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = make_venv(venv, "# one", MARKED)
    # the marker reached pip whole: pip evaluated it (false here) instead of refusing the word '<'
    assert done.returncode == 0, done.stderr
    assert "Invalid requirement" not in done.stderr
    stamp = (venv / ".imexctl-venv").read_text()
    mark = venv / "made-by-this-test"
    mark.touch()

    # the same lines: the venv stays as it is
    assert make_venv(venv, "# one", MARKED).returncode == 0
    assert mark.exists() and (venv / ".imexctl-venv").read_text() == stamp

    # one line changed: made again from nothing, with another stamp
    assert make_venv(venv, "# two", MARKED).returncode == 0
    assert not mark.exists()
    assert (venv / ".imexctl-venv").read_text() != stamp

    # an interpreter that no longer starts: made again
    mark.touch()
    (venv / "bin/python").unlink()
    assert make_venv(venv, "# two", MARKED).returncode == 0
    assert not mark.exists() and (venv / "bin/python").exists()


def test_a_failed_install_leaves_no_stamp_and_the_next_run_starts_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = make_venv(venv, "imexctl-no-such-distribution==1")
    assert done.returncode != 0
    assert f"make_venv: pip could not install into {venv}:" in done.stderr
    assert "    imexctl-no-such-distribution==1" in done.stderr
    assert not (venv / ".imexctl-venv").exists()
    assert make_venv(venv, "# one").returncode == 0
    assert (venv / ".imexctl-venv").is_file()


def test_a_missing_prerequisite_skips_but_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no such tool$"):
        unavailable("no such tool")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(
        pytest.fail.Exception, match=r"^no such tool \(CI=true: a missing prerequisite fails the test\)$"
    ):
        unavailable("no such tool")
