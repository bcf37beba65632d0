"""The fast unit tests also pass as an unprivileged user: nothing in them silently relies on root.

CI runs as root, so this test runs the unit-test modules that touch files,
ownership, modes and the hooks' flow once more as the lab's unprivileged
user (``imexlab``, made by ``.ci/setup test``).  Tests that really need root
(chown to another uid, real device nodes) skip there with the reason.
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
MODULES = [
    "tests/config/test_settings.py",
    "tests/cli/test_cli.py",
    "tests/hooks/test_prolog_epilog.py",
    "tests/channels/test_devices.py",
    "tests/imex/test_daemon.py",
    "tests/hooks/test_readiness.py",
    "tests/platform/test_fsutil.py",
    "tests/test_dirs.py",
    "tests/hooks/test_members.py",
    "tests/slurm/test_topofile.py",
    "tests/hooks/test_topology_prolog.py",
    "tests/channels/test_taskprolog.py",
    "tests/channels/test_enroot.py",
    "tests/doctor/test_containers.py",
]


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
    """The file, config, CLI and hook-flow tests pass as uid != 0; skips only name root-only needs."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
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
        "-rs",
        *MODULES,
    ]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("needs root" in line for line in skips), skips
    assert " passed" in done.stdout.strip().splitlines()[-1]
