"""Run one ``imexctl`` command with faults at its step boundaries.

``python -m tests.faults.driver <imexctl arguments>`` behaves like
``python -m imexctl`` except that ``IMEXCTL_FAULTS`` names what to do at which
step (the names of :class:`imexctl.hooks.runtime.Runtime`), separated by ``;``:

``STEP[#N]=kill``
    SIGKILL this process at the N-th time (default first) STEP is reached.
``STEP[#N]=term``
    SIGTERM this process there (as slurmd does at a hook's timeout).
``STEP[#N]=pause``
    Write ``STEP.reached`` (holding the pid) in ``IMEXCTL_FAULT_DIR`` and wait
    until ``STEP.go`` appears there (at most ``IMEXCTL_FAULT_PAUSE_S``, default
    120 s): the test decides what runs in between.
``STEP[#N]=kill_after:S``
    SIGKILL this process S seconds after STEP, wherever it is by then (a
    random point inside the next step, e.g. during the readiness wait).

STEP ``start`` is reached once, before the command runs.  Every step reached
is appended to ``IMEXCTL_FAULT_DIR/steps`` (one line, ``<pid> <step>``), so a
test can check that the fault happened where it asked.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

__all__ = ["Fault", "Injector", "parse"]

ACTIONS = ("kill", "term", "pause", "kill_after")


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: what to do at the ``nth`` time ``step`` is reached."""

    step: str
    nth: int
    action: str
    seconds: float = 0.0


def parse(text: str) -> list[Fault]:
    """Parse ``IMEXCTL_FAULTS``; raises ValueError naming the bad entry."""
    out = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        where, sep, what = entry.partition("=")
        step, _, nth = where.partition("#")
        action, _, arg = what.partition(":")
        if not sep or not step or action not in ACTIONS or (action == "kill_after") != bool(arg):
            raise ValueError(f"bad IMEXCTL_FAULTS entry {entry!r}")
        out.append(Fault(step, int(nth or 1), action, float(arg or 0)))
    return out


class Injector:
    """The ``on_step`` callback: records each step and acts on the faults that match it."""

    def __init__(self, faults: list[Fault], fault_dir: Path | None, pause_s: float) -> None:
        self.faults = faults
        self.dir = fault_dir
        self.pause_s = pause_s
        self.seen: Counter[str] = Counter()

    def __call__(self, step: str) -> None:
        self.seen[step] += 1
        if self.dir is not None:
            with (self.dir / "steps").open("a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {step}\n")
        for fault in self.faults:
            if fault.step == step and fault.nth == self.seen[step]:
                self._act(fault)

    def _act(self, fault: Fault) -> None:
        if fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.action == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif fault.action == "kill_after":
            timer = threading.Timer(fault.seconds, os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()
        else:
            self._pause(fault.step)

    def _pause(self, step: str) -> None:
        if self.dir is None:
            raise RuntimeError("pause needs IMEXCTL_FAULT_DIR")
        # written whole, then renamed: whoever sees STEP.reached reads the pid, never an empty file
        part = self.dir / f"{step}.reached.part"
        part.write_text(f"{os.getpid()}\n", encoding="utf-8")
        part.rename(self.dir / f"{step}.reached")
        go = self.dir / f"{step}.go"
        deadline = time.monotonic() + self.pause_s
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def main() -> int:
    """Run imexctl's main with the faults of the environment."""
    from imexctl.cli import main as imexctl_main

    fault_dir = Path(os.environ["IMEXCTL_FAULT_DIR"]) if os.environ.get("IMEXCTL_FAULT_DIR") else None
    injector = Injector(
        parse(os.environ.get("IMEXCTL_FAULTS", "")), fault_dir, float(os.environ.get("IMEXCTL_FAULT_PAUSE_S", "120"))
    )
    injector("start")
    return imexctl_main(sys.argv[1:], on_step=injector)


if __name__ == "__main__":
    sys.exit(main())
