"""The fast unit tests also pass as an unprivileged user: nothing in them silently relies on root.

CI runs as root, so this test runs the fast tests (all but the labs, the
fault injection, the packages, the bench and the fresh root) once more as the lab's
unprivileged user (``imexlab``, made by ``.ci/setup test``).  Tests that
really need root (chown to another uid, real device nodes, network
namespaces) skip there and say so; the GPU tests skip as they do as root.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER = "imexlab"
#: the fast tests: everything but the labs, the fault injection, the packages, the bench and the fresh root (they
#: need root)
FAST = "not (slurm or systemd or faults or packaging or bench or freshroot)"


def _user_exists() -> bool:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return False
    return True


#: a hang guard for the whole run (a few minutes on a loaded 2-core machine); a test still running after
#: HANG_S has its stack printed (faulthandler), so a run that ends at the guard says which test it was in
TIMEOUT_S = 1200
HANG_S = 300


def run_as_user(*select: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run pytest as ``USER`` on the tests ``select`` picks; fail naming what failed, or where it hung."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    # the checkout is root's: git (tests/test_lint.py asks it what is tracked) would refuse it as "dubious"
    env |= {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": str(REPO)}
    # progress by file (not -q), unbuffered: a run cut short shows the file it was in
    env |= {"PYTHONUNBUFFERED": "1"}
    argv = ["/usr/sbin/runuser", "-u", USER, "--", sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    argv += ["-p", "no:randomly", "-rfEs", "-o", f"faulthandler_timeout={HANG_S}", *select]
    # its own session: at the guard, the whole run goes (runuser's child too, not runuser alone)
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.strip()]
        dump = err[err.rfind("Timeout (") :][:6000] if "Timeout (" in err else err[-3000:]
        pytest.fail(
            f"the run as {USER} did not end within {timeout:.0f} s; it was in {lines[-1] if lines else '(no output)'}"
            f"\n{out[-3000:]}\n--- faulthandler's stacks of a test that ran over {HANG_S} s ---\n{dump}",
            pytrace=False,
        )
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    # what failed first: the summary's FAILED/ERROR lines, then the start of the failures' report (the tail is
    # mostly the skip list)
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    report = done.stdout.partition("= FAILURES =")[2] or done.stdout.partition("= ERRORS =")[2]
    if done.returncode != 0:
        pytest.fail(
            "\n".join([f"as {USER}, exit {done.returncode}:", *failed, report[:8000], done.stdout[-1500:],
                       done.stderr[-2000:]]),
            pytrace=False,
        )  # fmt: skip
    return done


@pytest.mark.skipif(
    os.geteuid() != 0 or not _user_exists(),
    reason=f"needs root to switch to the unprivileged user {USER} (made by '.ci/setup test')",
)
@pytest.mark.limit_s(TIMEOUT_S + 120)  # its own guard ends the run first, naming where it was
def test_unit_tests_pass_as_an_unprivileged_user() -> None:
    """The fast tests pass as uid != 0; the skips name what needs root (or NVML)."""
    done = run_as_user("-m", FAST, "--deselect", "tests/test_unprivileged.py")
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("root" in line or "NVML does not initialise" in line for line in skips), skips
    assert " passed" in done.stdout.strip().splitlines()[-1]
