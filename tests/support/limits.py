"""Each test's own time limit: a test that hangs fails by name, not as the whole run's timeout (issue 41).

A hang (a lock taken blocking where it must be tried once, a read that never
returns) otherwise shows only as CI's 90-minute limit, with no word of the test
that hung.  Here each test's call has a limit by its kind (:func:`limit_of`):

- at the limit, ``SIGALRM`` raises :class:`TestOverran` in the test, naming it
  and its limit; a blocking system call is interrupted for it (PEP 475 retries
  a call only when the handler returns), so the test fails and the run goes on;
- :data:`GRACE_S` later, if the test still has not ended (stuck in C code
  that never returns to the interpreter), a watchdog thread prints the test's
  id and every thread's stack to stderr and ends the process, so the run's log
  still says which test it was.

A test that needs more says so with ``@pytest.mark.limit_s(seconds)``.  A test
that sets its own ``SIGALRM`` (tests/platform/test_fsutil.py) replaces this
one's for its own span.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

#: a test's call, by default (a unit test takes well under a second; the slowest unmarked ones about a minute)
DEFAULT_S = 300.0
#: the markers of tests that drive real Slurm, booted nodes, builds or long fault cycles, and their call's limit
HEAVY = frozenset({"slurm", "systemd", "faults", "packaging", "bench", "freshroot"})
HEAVY_S = 1800.0
#: how long after the limit the watchdog ends a process whose test never returned to the interpreter
#: (``IMEXCTL_LIMIT_GRACE_S`` shortens it for tests/test_limits.py)
GRACE_S = 60.0
#: the watchdog's exit status (EX_SOFTWARE)
WATCHDOG_EXIT = 70


class TestOverran(Exception):
    """A test ran past its limit; the message names it."""

    __test__ = False  # not a test class, whatever its name


def limit_of(item: pytest.Item) -> float:
    """The test's limit in seconds: its ``limit_s`` marker, else by its markers' kind."""
    marker = item.get_closest_marker("limit_s")
    if marker is not None:
        if len(marker.args) != 1 or not isinstance(marker.args[0], (int, float)) or marker.args[0] <= 0:
            raise pytest.UsageError(f"{item.nodeid}: limit_s takes one positive number of seconds")
        return float(marker.args[0])
    if any(item.get_closest_marker(name) is not None for name in HEAVY):
        return HEAVY_S
    return DEFAULT_S


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run the test's call under its limit (main thread only: signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = limit_of(item)
    what = f"{item.nodeid} ran over its limit of {limit:g} s (tests/support/limits.py)"

    def overran(signum: int, frame: Any) -> None:
        raise TestOverran(what)

    grace = float(os.environ.get("IMEXCTL_LIMIT_GRACE_S", GRACE_S))
    done = threading.Event()
    capture = item.config.pluginmanager.getplugin("capturemanager")
    watchdog = threading.Thread(target=_watch, args=(done, limit + grace, grace, what, capture), daemon=True)
    old = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, limit)
    watchdog.start()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        done.set()


def _watch(done: threading.Event, after_s: float, grace_s: float, what: str, capture: Any) -> None:
    """End the process, naming the test and showing every stack, if the test has not ended ``after_s`` from now.

    pytest's capture holds file descriptor 2 during a test: it is given back first, or the words would go to a
    file that the exit throws away.
    """
    if done.wait(after_s):
        return
    if capture is not None:
        capture.suspend_global_capture(in_=False)
    sys.stderr.write(f"\n{what}, and did not end {grace_s:g} s later: every thread's stack follows\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(WATCHDOG_EXIT)
