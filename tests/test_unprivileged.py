"""The fast unit tests also pass as an unprivileged user: nothing in them silently relies on root.

CI runs as root, so this test runs the fast tests (all but the labs, the
fault injection, the packages and the bench) once more as the lab's
unprivileged user (``imexlab``, made by ``.ci/setup test``).  Tests that
really need root (chown to another uid, real device nodes, network
namespaces) skip there and say so; the GPU tests skip as they do as root.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER = "imexlab"
#: the fast tests: everything but the labs, the fault injection, the packages and the bench (they need root)
FAST = "not (slurm or systemd or faults or packaging or bench)"


def _user_exists() -> bool:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return False
    return True


@pytest.mark.skipif(
    os.geteuid() != 0 or not _user_exists(),
    reason=f"needs root to switch to the unprivileged user {USER} (made by '.ci/setup test')",
)
def test_unit_tests_pass_as_an_unprivileged_user() -> None:
    """The fast tests pass as uid != 0; the skips name what needs root (or NVML)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    # the checkout is root's: git (tests/test_lint.py asks it what is tracked) would refuse it as "dubious"
    env |= {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": str(REPO)}
    argv = [
        "/usr/sbin/runuser",
        "-u",
        USER,
        "--",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-rfEs",
        "-m",
        FAST,
        "--deselect",
        "tests/test_unprivileged.py",
    ]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    # what failed first: the summary's FAILED/ERROR lines, then the start of the failures' report (the tail is
    # mostly the skip list)
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    report = done.stdout.partition("= FAILURES =")[2] or done.stdout.partition("= ERRORS =")[2]
    assert done.returncode == 0, "\n".join([*failed, report[:8000], done.stdout[-1500:], done.stderr[-2000:]])
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("root" in line or "NVML does not initialise" in line for line in skips), skips
    assert " passed" in done.stdout.strip().splitlines()[-1]
