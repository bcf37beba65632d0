"""A simulated rack whose hooks run under the fault driver (tests/faults/driver.py)."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from imexctl.commands.demo import HookResult, SimRack, Tray

__all__ = ["FaultRack", "Run"]

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Run:
    """One hook process under the driver, and its fault directory."""

    tray: Tray
    proc: subprocess.Popen[bytes]
    dir: Path

    def steps(self) -> list[str]:
        """The steps this run reached, in order (``start`` first)."""
        path = self.dir / "steps"
        return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []

    def reached(self, step: str, timeout: float = 60) -> bool:
        """Wait until the run pauses at ``step``; False if it ended first or the time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.dir / f"{step}.reached").exists():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def release(self, step: str) -> None:
        """Let a run paused at ``step`` go on."""
        (self.dir / f"{step}.go").touch()

    def result(self, timeout: float = 120) -> HookResult:
        """Wait for the run to end."""
        out, _ = self.proc.communicate(timeout=timeout)
        return HookResult(self.tray, self.proc.returncode, out.decode(errors="replace"))


class FaultRack(SimRack):
    """:class:`SimRack` plus hooks under the fault driver and a strict "is this tray clean" check."""

    runs = 0

    def start(
        self,
        t: Tray,
        hook: str,
        job_id: int,
        faults: str = "",
        *,
        trays: list[Tray] | None = None,
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> Run:
        """Start ``imexctl <hook>`` on tray ``t`` (a job hook, or an admin command with ``job_id`` 0)."""
        FaultRack.runs += 1
        fdir = self.base / f"run{FaultRack.runs}"
        fdir.mkdir()
        if hook in ("prolog", "epilog"):
            base_env = self.job_env(t, job_id, hook, trays)
        else:
            base_env = {"SLURMD_NODENAME": t.name, "IMEXCTL_CONFIG": str(t.config), "PYTHONPATH": str(REPO)}
        base_env.update(PYTHONPATH=str(REPO), IMEXCTL_FAULTS=faults, IMEXCTL_FAULT_DIR=str(fdir))
        base_env.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.driver", hook, *args],
            env=base_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        return Run(t, proc, fdir)

    def run(self, t: Tray, hook: str, job_id: int, faults: str = "", **kw: object) -> tuple[HookResult, Run]:
        """Run a hook to its end (or its fault)."""
        r = self.start(t, hook, job_id, faults, **kw)  # type: ignore[arg-type]
        return r.result(), r

    def run_all(self, hook: str, job_id: int, faults: Mapping[str, str] | None = None) -> list[HookResult]:
        """Run ``hook`` on every tray at once; ``faults`` maps a tray name to its faults."""
        runs = [self.start(t, hook, job_id, (faults or {}).get(t.name, "")) for t in self.trays]
        return [r.result() for r in runs]

    def lock_held(self, t: Tray) -> bool:
        """Whether some process holds tray ``t``'s node lock now."""
        path = t.root / "run/imexctl/lock"
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def dirty(self) -> list[str]:
        """Everything left on any tray: job directories, channels, processes, a held node lock."""
        left = self.leftovers()
        left += [f"{t.name}: node lock held" for t in self.trays if self.lock_held(t)]
        return left
