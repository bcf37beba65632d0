"""Booted containers: the cached Debian root's systemd as PID 1 under ``systemd-nspawn -b``.

A :class:`Container` boots an overlay of the cached root (debroot.py), never the root itself and never the
host's own root (systemd's tmpfiles would clean the host's /tmp; shared/reference/slurm-lab.md). Its disk is
``<top>/upper`` and lives across a stop and a start, like a node's disk across a reboot; ``/run``, ``/tmp``
and ``/dev`` are fresh on every boot. Each container runs in a network namespace the lab made
(``--network-namespace-path``) and in cgroups of its own under ours (``<machine>`` in each hierarchy nspawn
uses), so two containers never share nspawn's ``payload`` cgroup on a host without systemd.

Each boot gets a new time namespace whose boot clock starts near 0, as after a real reboot (slurmd reports
its uptime, and slurmctld tells a rebooted node by it). Commands reach the container through its init:
``nsenter -t <init pid> -a`` (no machined needed). Recorded for teardown from any process
(:meth:`Container.to_state`): the launcher's, nspawn's and init's pids with their start times, the cgroups
made, the overlay's top directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.lab.procs import (
    SYS_PATH,
    LabError,
    ProcRecord,
    mount_private,
    mountpoints_under,
    proc_alive,
    proc_record,
    proc_start_time,
    sh,
    unmount_all,
)
from tests.simhelpers import wait_for

__all__ = ["Container", "boot_problems", "cgroup_parents", "nspawn_problems", "remove_cgroup"]

NSPAWN = "systemd-nspawn"
#: the environment of every command run inside a container
INNER_ENV = {"PATH": SYS_PATH, "LANG": "C.UTF-8", "HOME": "/root"}
BOOT_TIMEOUT = 120.0
STOP_TIMEOUT = 45.0
# what `systemctl is-system-running` says of a booted system (degraded: some unit failed; the lab reports it)
BOOTED = ("running", "degraded")


def nspawn_problems() -> list[str]:
    """Return why this machine cannot boot containers (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (systemd-nspawn, mounts and network namespaces need root)")
    tools = (NSPAWN, "nsenter", "unshare", "mount", "umount", "ip")
    missing = [b for b in tools if shutil.which(b, path=SYS_PATH) is None]
    if missing:
        problems.append(f"missing {', '.join(missing)} (apt-get install systemd-container util-linux iproute2)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("the kernel has no overlay file system")
    if not cgroup_parents():
        problems.append("no cgroup hierarchy for containers (neither cgroup2 nor name=systemd is mounted)")
    return problems


def boot_problems(root: Path, machine: str) -> list[str]:
    """Return why containers cannot run here, found by trying (empty when they can).

    ``unshare --time`` (a new time namespace per boot), then ``systemd-nspawn --volatile=yes /bin/true`` on
    ``root`` (a tmpfs over it: the root is not written), in a cgroup of its own that is removed afterwards.
    """
    res = sh(["unshare", "--time", "--fork", "true"], check=False)
    if res.returncode != 0:
        return [f"no time namespaces (unshare --time: {res.stderr.strip() or res.returncode})"]
    cg = [parent / machine for parent in cgroup_parents()]
    for d in cg:
        d.mkdir(exist_ok=True)
    argv = [NSPAWN, "--register=no", "--keep-unit", "--quiet", f"--directory={root}", f"--machine={machine}"]
    try:
        res = sh([*_join_cgroups(cg), *argv, "--volatile=yes", "/bin/true"], check=False, timeout=60)
    finally:
        for d in cg:
            remove_cgroup(d)
    if res.returncode != 0:
        out = (res.stderr + res.stdout).strip().splitlines()[-3:]
        return [f"{NSPAWN} cannot run a container here (exit {res.returncode}): {' / '.join(out)}"]
    return []


def _join_cgroups(dirs: Sequence[Path]) -> list[str]:
    """argv prefix: a shell joins these cgroups, then execs the rest of the command line."""
    join = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1/cgroup.procs" || exit 1; shift; n=$((n-1)); done'
    return ["/bin/sh", "-c", f'{join}; exec "$@"', "sh", str(len(dirs)), *map(str, dirs)]


def cgroup_parents() -> list[Path]:
    """Return our own cgroup directory in each hierarchy nspawn uses: the cgroup2 one and name=systemd (v1)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and not controllers:
            own["cgroup2"] = path
        elif "name=systemd" in controllers.split(","):
            own["name=systemd"] = path
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        key = "cgroup2" if fstype == "cgroup2" else "name=systemd" if "name=systemd" in options else None
        if key and key in own and fields[3] == "/":
            out.append(Path(fields[4]) / own.pop(key).lstrip("/"))
    return out


def _children(pid: int) -> list[int]:
    """Return the live children of a process."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        kids = [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []
    return [k for k in kids if proc_start_time(k) is not None]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Container:
    """One booted Debian root: ``name`` is its host name, ``machine`` its name on the host (unique)."""

    def __init__(
        self,
        name: str,
        machine: str,
        top: Path,
        lower: Path,
        netns: str,
        binds: Sequence[tuple[str, str, bool]] = (),
        capabilities: Sequence[str] = (),
    ) -> None:
        self.name, self.machine, self.top, self.lower, self.netns = name, machine, Path(top), Path(lower), netns
        self.binds = [tuple(b) for b in binds]  # (host path, path inside, read-only)
        #: capabilities beyond nspawn's default set (CAP_NET_ADMIN: its own network namespace's firewall)
        self.capabilities = list(capabilities)
        self.launcher: ProcRecord | None = None
        self.nspawn: ProcRecord | None = None
        self.init: ProcRecord | None = None
        self.cgroups: list[str] = []
        self.boots = 0
        self._popen: subprocess.Popen[bytes] | None = None

    # -- state --------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Return what :meth:`from_state` needs (for teardown from another process)."""
        return {
            "name": self.name,
            "machine": self.machine,
            "top": str(self.top),
            "lower": str(self.lower),
            "netns": self.netns,
            "binds": [list(b) for b in self.binds],
            "launcher": self.launcher,
            "nspawn": self.nspawn,
            "init": self.init,
            "cgroups": self.cgroups,
            "boots": self.boots,
        }

    @classmethod
    def from_state(cls, st: Mapping[str, Any]) -> Container:
        """Rebuild a container recorded by :meth:`to_state`."""
        c = cls(st["name"], st["machine"], Path(st["top"]), Path(st["lower"]), st["netns"], st.get("binds", ()))
        c.launcher, c.nspawn, c.init = st.get("launcher"), st.get("nspawn"), st.get("init")
        c.cgroups, c.boots = st.get("cgroups", []), st["boots"]
        return c

    @property
    def merged(self) -> Path:
        """The container's file system as the host sees it (its disk; not /run, /tmp or /dev)."""
        return self.top / "merged"

    @property
    def view(self) -> Path:
        """The running container's whole file system (its mount namespace) as the host can read it."""
        if not self.running():
            raise LabError(f"{self.name} is not running")
        return Path(f"/proc/{self.init_pid}/root")

    @property
    def init_pid(self) -> int:
        """The host pid of the container's systemd."""
        if self.init is None:
            raise LabError(f"{self.name} has not been booted")
        return self.init["pid"]

    @property
    def console(self) -> Path:
        """nspawn's output: the boot messages of every boot."""
        return self.top / "console.log"

    def running(self) -> bool:
        """Say whether the recorded init still runs."""
        return proc_alive(self.init)

    # -- disk ---------------------------------------------------------------------------------------

    def mount(self) -> None:
        """Mount the overlay of the cached root at ``merged`` (a private mount under a private self-bind)."""
        for sub in ("upper", "work", "merged"):
            (self.top / sub).mkdir(parents=True, exist_ok=True)
        mount_private(["--bind", str(self.top)], self.top)
        opts = f"lowerdir={self.lower},upperdir={self.top / 'upper'},workdir={self.top / 'work'}"
        mount_private(["-t", "overlay", "overlay", "-o", opts], self.merged)

    def unmount(self) -> None:
        """Unmount the overlay (the container must be stopped)."""
        errors = unmount_all(self.top)
        left = mountpoints_under(self.top)
        if left:
            raise LabError(f"mounts left under {self.top}: {left} ({'; '.join(errors)})")

    # -- boot and stop ------------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        argv = [
            NSPAWN,
            "--register=no",
            "--keep-unit",
            "--quiet",
            f"--directory={self.merged}",
            f"--machine={self.machine}",
            f"--hostname={self.name}",
            f"--network-namespace-path=/run/netns/{self.netns}",
            # leave the root's resolv.conf, time zone and journal alone; nothing of the host's goes in
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
        ]
        argv += [f"--bind{'-ro' if ro else ''}={host}:{inside}" for host, inside, ro in self.binds]
        argv += [f"--capability={','.join(self.capabilities)}"] if self.capabilities else []
        return [*argv, "--boot"]

    def _make_cgroups(self) -> list[Path]:
        dirs = [parent / self.machine for parent in cgroup_parents()]
        for d in dirs:
            d.mkdir(exist_ok=True)
            if str(d) not in self.cgroups:
                self.cgroups.append(str(d))
        return dirs

    def _launcher(self, dirs: Sequence[Path]) -> list[str]:
        """sh joins the cgroups, then execs unshare, whose child in a new time namespace execs nspawn.

        nspawn makes its payload/ cgroup under the cgroups joined. The time namespace starts the boot clock
        near 0, as a real boot does: slurmd reports its uptime and slurmctld tells a reboot by it.
        ``--kill-child`` takes nspawn down with the launcher.
        """
        boottime = int(float(Path("/proc/uptime").read_text().split()[0])) - 1
        timens = ["unshare", "--time", "--fork", "--kill-child=SIGTERM", f"--boottime=-{boottime}", "--"]
        return [*_join_cgroups(dirs), *timens, *self._argv()]

    def start(self, save: Callable[[], None] | None = None) -> None:
        """Start nspawn in the background, in cgroups of its own; record the launcher's, nspawn's, init's pids."""
        if self.running():
            raise LabError(f"{self.name} runs already (init pid {self.init_pid})")
        argv = self._launcher(self._make_cgroups())
        with open(self.console, "ab") as out:
            out.write(f"\n===== boot {self.boots + 1}: {' '.join(argv)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": SYS_PATH, "LANG": "C"},
            )
        self.boots += 1
        self.nspawn, self.init = None, None
        self.launcher = proc_record(self._popen.pid)
        if save:
            save()
        self.nspawn = proc_record(self._child(self.launcher, "systemd-nspawn"))
        if save:
            save()
        self.init = proc_record(self._child(self.nspawn, "systemd"))
        if save:
            save()

    def _child(self, parent: ProcRecord, comm: str) -> int:
        """Wait for the child called ``comm`` of a recorded process; fail with the console if it died."""

        def found() -> int | None:
            if not proc_alive(parent):
                raise LabError(f"{self.name}: pid {parent['pid']} exited before {comm} started: {self.console_tail()}")
            kids = [k for k in _children(parent["pid"]) if _comm(k) == comm]
            return kids[0] if kids else None

        return int(wait_for(found, 30, 0.05, what=f"{self.name}'s {comm} to start"))

    def wait_booted(self, timeout: float = BOOT_TIMEOUT) -> str:
        """Wait until the container's boot has finished; return ``running`` or ``degraded``."""
        deadline = time.monotonic() + timeout

        def answered() -> str | None:
            # until its systemd listens, systemctl prints nothing (and exits non-zero): ask again.
            # It prints "offline" while /run/systemd/system is missing (sd_booted() false), which it is
            # in the moments after nspawn's child has exec'd systemd and before systemd makes it: ask again
            left = max(1.0, deadline - time.monotonic())
            try:
                res = self.exec(["systemctl", "is-system-running", "--wait"], check=False, timeout=left)
            except subprocess.TimeoutExpired:
                return None
            state = res.stdout.strip()
            return None if state in ("", "offline") else state

        try:
            state = str(wait_for(answered, timeout, 0.2, what=f"{self.name} to boot"))
        except AssertionError:
            jobs = self.exec(["systemctl", "list-jobs", "--no-pager"], check=False, timeout=10).stdout
            raise LabError(f"{self.name} did not finish booting in {timeout:.0f}s; jobs:\n{jobs}") from None
        if state not in BOOTED:
            raise LabError(f"{self.name} booted into state {state!r}:\n{self.console_tail()}")
        return state

    def stop(self, clean: bool = True, timeout: float = STOP_TIMEOUT) -> None:
        """Shut the container down (clean: SIGTERM to nspawn, a poweroff) or pull its plug (SIGKILL to init).

        Falls back to SIGKILL when a clean shutdown takes longer than ``timeout``; idempotent.
        """
        if clean and proc_alive(self.nspawn) and self.nspawn:
            os.kill(self.nspawn["pid"], signal.SIGTERM)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not proc_alive(self.nspawn), timeout, what=f"{self.name} to shut down")
        for rec in (self.init, self.nspawn, self.launcher):  # the init's death ends the whole container
            if proc_alive(rec) and rec:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rec["pid"], signal.SIGKILL)
                wait_for(lambda r=rec: not proc_alive(r), 15, what=f"{self.name} pid {rec['pid']} to die")
        if self._popen is not None:
            self._popen.poll()
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        """Remove the cgroups made for the container (empty once it stopped; anything left is killed)."""
        for path in list(self.cgroups):
            remove_cgroup(Path(path))
            self.cgroups.remove(path)

    def console_tail(self, lines: int = 25) -> str:
        """Return the end of nspawn's output (the last boot's messages)."""
        try:
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no console output)"

    # -- commands -----------------------------------------------------------------------------------

    def command(self, argv: Sequence[str], user: tuple[int, int] | None = None, cwd: str | None = None) -> list[str]:
        """Return the host argv that runs ``argv`` inside the container (as ``user`` = (uid, gid))."""
        ids = ["-S", str(user[0]), "-G", str(user[1])] if user else []
        # nsenter's --wd opens the directory on the host's side: change it inside instead
        wd = ["/usr/bin/env", "-C", cwd] if cwd else []
        return ["nsenter", "-t", str(self.init_pid), "-a", *ids, "--", *wd, *argv]

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: tuple[int, int] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container and wait for it (root unless ``user``)."""
        if not self.running():
            raise LabError(f"{self.name} is not running: {self.console_tail(5)}")
        full = self.command(argv, user, cwd)
        res = sh(full, check=False, timeout=timeout, env={**INNER_ENV, **(env or {})})
        if check and res.returncode != 0:
            raise LabError(f"{self.name}: {' '.join(argv)} failed ({res.returncode}): {res.stderr}{res.stdout}")
        return res

    def shell(self, script: str, *, cwd: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a line of shell inside the container as root (``/bin/sh -ec``), as an administrator types it."""
        return self.exec(["/bin/sh", "-ec", script], cwd=cwd, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """Return ``systemctl show`` properties of one unit."""
        res = self.exec(["systemctl", "show", f"--property={','.join(props)}", "--", unit])
        return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)

    def units(self, pattern: str) -> list[str]:
        """Return the units systemd has loaded (whatever their state) whose names match ``pattern``."""
        res = self.exec(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--", pattern])
        return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]

    def journal(self, unit: str, since_boot: bool = True) -> str:
        """Return the journal of one unit (this boot's), message lines only."""
        argv = ["journalctl", "--no-pager", "-o", "cat", "-u", unit]
        return self.exec([*argv, "-b"] if since_boot else argv, timeout=30).stdout


def _cgroup_pids(path: Path) -> list[int]:
    """Return the processes in a cgroup and below it."""
    pids = []
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def remove_cgroup(path: Path, timeout: float = 10) -> None:
    """SIGKILL whatever is left in a cgroup tree, then remove its directories, innermost first."""
    if not path.exists():
        return

    def removed() -> bool:
        for pid in _cgroup_pids(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in [*sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), path]:
            with contextlib.suppress(OSError):
                d.rmdir()
        return not path.exists()

    wait_for(removed, timeout, 0.1, what=f"cgroup {path} to be removed")
