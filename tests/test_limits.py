"""Each test's own time limit (tests/support/limits.py): a hang fails by name, and the run goes on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import limits

REPO = Path(__file__).resolve().parent.parent

HANGS = '''
import fcntl, os, signal, subprocess, sys, time
import pytest

@pytest.fixture
def held(tmp_path):
    """A lock file that another process holds."""
    path = tmp_path / "lock"
    path.touch()
    child = subprocess.Popen([sys.executable, "-c",
        "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); "
        "time.sleep(600)", str(path)], stdout=subprocess.PIPE)
    assert child.stdout.readline()
    yield path
    child.kill()
    child.wait()

@pytest.mark.limit_s(1)
def test_waits_for_a_lock_blocking(held):
    with open(held) as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # the plausible wrong change: a lock taken blocking

def test_after_it():
    pass

@pytest.mark.limit_s(1)
def test_never_back_in_the_interpreter():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
'''


def _run(tmp_path: Path, select: str) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    limit_s(seconds): the limit\n")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.limits", "-rf"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "IMEXCTL_LIMIT_GRACE_S": "2"}
    t0 = time.monotonic()
    done = subprocess.run(
        [*argv, f"test_hangs.py::{select}" if "::" not in select else select, "test_hangs.py::test_after_it"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done, time.monotonic() - t0


def test_a_test_blocked_on_a_lock_fails_by_name_at_its_limit_and_the_run_goes_on(tmp_path: Path) -> None:
    """A blocking ``flock`` on a lock another process holds: the test fails named, after about its limit."""
    done, took = _run(tmp_path, "test_waits_for_a_lock_blocking")
    assert "FAILED test_hangs.py::test_waits_for_a_lock_blocking" in done.stdout, done.stdout
    assert "test_waits_for_a_lock_blocking ran over its limit of 1 s" in done.stdout, done.stdout
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert took < 30, took


def test_a_test_that_never_returns_to_the_interpreter_ends_the_run_naming_it(tmp_path: Path) -> None:
    """``SIGALRM`` blocked: the watchdog names the test, prints the stacks and ends the process."""
    done, took = _run(tmp_path, "test_never_back_in_the_interpreter")
    assert done.returncode == limits.WATCHDOG_EXIT, (done.returncode, done.stdout, done.stderr)
    said = "test_hangs.py::test_never_back_in_the_interpreter ran over its limit of 1 s (tests/support/limits.py)"
    assert f"{said}, and did not end 2 s later" in done.stderr, done.stderr
    assert "in test_never_back_in_the_interpreter" in done.stderr.split("follows", 1)[1], done.stderr
    assert took < 30, took


def test_the_limit_follows_the_marker_then_the_kind() -> None:
    """``limit_s`` first; a lab, fault, build or bench test gets the heavy limit; any other the default."""

    class Item:
        nodeid = "t.py::x"

        def __init__(self, **marks: tuple[object, ...]) -> None:
            self.marks = marks

        def get_closest_marker(self, name: str) -> object:
            return pytest.mark.__getattr__(name)(*self.marks[name]).mark if name in self.marks else None

    assert limits.limit_of(Item(limit_s=(7,))) == 7  # type: ignore[arg-type]
    assert limits.limit_of(Item(slurm=())) == limits.HEAVY_S  # type: ignore[arg-type]
    assert limits.limit_of(Item()) == limits.DEFAULT_S  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="limit_s takes one positive number"):
        limits.limit_of(Item(limit_s=(0,)))  # type: ignore[arg-type]
