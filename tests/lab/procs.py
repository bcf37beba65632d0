"""Processes and commands of the lab: pids recorded with their start time, so a reused pid is never signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tests.simhelpers import wait_for

__all__ = [
    "SYS_PATH",
    "LabError",
    "ProcRecord",
    "mount_private",
    "mountpoints_under",
    "netns_pids",
    "proc_alive",
    "proc_record",
    "proc_start_time",
    "processes_rooted_at",
    "sh",
    "terminate",
    "unmount_all",
]

SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# {"pid": pid, "start": start time in clock ticks since boot}; JSON-friendly, kept in the lab's state file
ProcRecord = dict[str, int]


class LabError(RuntimeError):
    """The lab could not be brought up, used or torn down."""


def sh(
    argv: Sequence[str],
    check: bool = True,
    timeout: float = 30,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command (absolute path or found on the system PATH) with captured text output."""
    res = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(env) if env is not None else {"PATH": SYS_PATH, "LANG": "C"},
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )
    if check and res.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def proc_start_time(pid: int) -> int | None:
    """Return the start time (clock ticks since boot) of a live, non-zombie process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_alive(rec: ProcRecord | None) -> bool:
    """Say whether the process recorded as {"pid", "start"} is still the same live process."""
    if not rec:
        return False
    return proc_start_time(rec["pid"]) == rec["start"]


def proc_record(pid: int) -> ProcRecord:
    """Record a pid with its start time."""
    start = proc_start_time(pid)
    if start is None:
        raise LabError(f"process {pid} died right after start")
    return {"pid": pid, "start": start}


def _live_pids() -> Iterable[int]:
    return (int(e) for e in os.listdir("/proc") if e.isdigit())


def terminate(recs: Iterable[ProcRecord], grace: float = 5.0) -> list[int]:
    """SIGTERM the recorded processes that are still alive, wait up to ``grace`` s, then SIGKILL the rest.

    Returns the pids that needed SIGKILL.
    """
    live = [r for r in recs if proc_alive(r)]
    for r in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(proc_alive(r) for r in live):
        time.sleep(0.02)
    killed = [r["pid"] for r in live if proc_alive(r)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if killed:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not any(proc_alive(r) for r in live), 5, what="SIGKILLed processes to die")
    return killed


def netns_pids(name: str) -> list[int]:
    """Return the live processes whose network namespace is the named one (``ip netns pids``, in-process)."""
    try:
        ns = os.stat(f"/run/netns/{name}")
    except OSError:
        return []
    pids = []
    for pid in _live_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (st.st_ino, st.st_dev) == (ns.st_ino, ns.st_dev) and proc_start_time(pid) is not None:
            pids.append(pid)
    return pids


def processes_rooted_at(root: Path) -> list[int]:
    """Return the live processes whose root directory (chroot) is ``root`` or below it."""
    want = str(root)
    pids = []
    for pid in _live_pids():
        try:
            where = os.readlink(f"/proc/{pid}/root")
        except OSError:
            continue
        if (where == want or where.startswith(want + "/")) and proc_start_time(pid) is not None:
            pids.append(pid)
    return pids


def mountpoints_under(top: Path) -> list[str]:
    """Return the mount points at or below ``top``, in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(top) or point.startswith(f"{top}/"):
            found.append(point)
    return found


def mount_private(args: Sequence[str], where: Path) -> None:
    """Mount and make the new mount private, so nothing propagates to or from the host's mounts."""
    sh(["mount", *args, str(where)])
    sh(["mount", "--make-private", str(where)])


def unmount_all(top: Path) -> list[str]:
    """Unmount everything at or below ``top``, innermost first (lazily if busy); return what needed ``-l``."""
    errors = []
    for point in reversed(mountpoints_under(top)):
        res = sh(["umount", point], check=False)
        if res.returncode != 0:
            time.sleep(0.2)
            res = sh(["umount", "-l", point], check=False)
            errors.append(f"{point}: {res.stderr.strip() or 'lazily unmounted'}")
    return errors
