"""How each Slurm of the lab runs: Debian 12's 22.05 from the host, Debian 13's 24.11 and sid's 26.05 from chroots.

A :class:`SlurmInstall` says how to run a Slurm command or daemon of its version, how munge and name
resolution are provided, and what it needs mounted. :class:`SlurmLab` (cluster.py) does the rest the same
way for both: network namespaces, slurm.conf, imexctl.conf, bring-up, teardown.

- :class:`HostSlurm` runs the host's ``slurmctld``/``slurmd``/clients and the host's ``munged``, and adds
  the lab's names to the host's ``/etc/hosts`` (lines marked ``# <prefix>-managed``).
- :class:`RootSlurm` runs everything from a Debian root (debroot.py: Debian 13 for 24.11, Debian sid for
  26.05) through a per-lab overlay, so the
  cached root stays clean and two labs never share a writable file: ``chroot <merged> ...`` for commands,
  ``unshare --uts chroot ...`` (plus ``nsenter --net`` for a node) for daemons, a ``munged`` of its own
  inside the root, and the lab's names in the overlay's ``/etc/hosts``. The lab directory is bind-mounted
  at the same path inside the root, and the checkout at ``/opt/imexctl-src`` (where the root's editable
  imexctl install looks), so every path the tests use means the same file inside and outside.
"""

from __future__ import annotations

import abc
import errno
import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from imexctl.platform.fsutil import atomic_write
from tests.lab import debroot
from tests.lab.procs import (
    SYS_PATH,
    LabError,
    ProcRecord,
    mount_private,
    mountpoints_under,
    proc_record,
    processes_rooted_at,
    sh,
    terminate,
    unmount_all,
)
from tests.simhelpers import wait_for

__all__ = ["HostSlurm", "LabNames", "RootSlurm", "SlurmInstall", "install_from_state"]

HOSTS = Path("/etc/hosts")
# (uid, gid) a client command runs as; None: root
User = Optional[tuple[int, int]]
# argv and extra subprocess arguments
Command = tuple[list[str], dict[str, Any]]


@dataclass(frozen=True)
class LabNames:
    """What makes one lab's names unique on the machine, so that two labs can run side by side.

    Namespaces are ``<prefix>-n<i>``, veths ``<prefix>-v<i>`` (15 characters at most: keep the prefix
    short), the state pointer ``/run/<prefix>.json``, the lock ``/run/<prefix>.lock``, a default lab
    directory ``/tmp/<prefix>-XXXX``. Addresses: ``<subnet>.1`` for slurmctld on ``bridge``, ``<subnet>.11``
    and up for the nodes (keep to 198.18.0.0/15, reserved for benchmarking). slurmctld listens in the root
    namespace, so each lab needs its own ``ctl_port``; every slurmd has a namespace of its own.
    ``first_job_id`` (slurm.conf ``FirstJobId``) keeps each lab's job ids apart from the others': the labs
    share one process table, and the hooks (``job_is_running``: a slurmstepd titled ``[<id>.``) and the
    tests (the running prologs of job N) find a job there by its id alone.
    """

    prefix: str
    bridge: str
    subnet: str
    ctl_port: int
    first_job_id: int = 1

    def __post_init__(self) -> None:
        if len(f"{self.prefix}-v200") > 15 or len(self.bridge) > 15:
            raise ValueError(f"interface names too long for prefix {self.prefix!r} / bridge {self.bridge!r}")
        if len(self.subnet.split(".")) != 3:
            raise ValueError(f"subnet must be the first three octets of a /24, got {self.subnet!r}")

    @property
    def pointer(self) -> Path:
        """The machine-wide record of this lab's state."""
        return Path(f"/run/{self.prefix}.json")

    @property
    def lock(self) -> Path:
        """The lock serialising bring-up and teardown of labs with these names."""
        return Path(f"/run/{self.prefix}.lock")


class SlurmInstall(abc.ABC):
    """One Slurm version the lab can run; subclasses say how."""

    kind = ""
    binaries = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "munge")

    def __init__(self, names: LabNames) -> None:
        self.names = names

    @abc.abstractmethod
    def problems(self) -> list[str]:
        """Return why this install cannot run here (empty when it can)."""

    def to_state(self) -> dict[str, Any]:
        """Return what :func:`install_from_state` needs to rebuild this object."""
        return {"kind": self.kind, "names": self.names.__dict__}

    @abc.abstractmethod
    def command(self, argv: Sequence[str], user: User = None, cwd: str | None = None) -> Command:
        """Return the argv and extra ``subprocess`` arguments that run a Slurm command of this version."""

    @abc.abstractmethod
    def daemon(self, hostname: str, argv: Sequence[str]) -> list[str]:
        """Return the argv that runs a daemon under its own UTS hostname (every step must exec)."""

    def path_inside(self, path: Path) -> Path:
        """Return the path by which Slurm's processes see a file of the checkout or the lab directory."""
        return path

    def attach(self, lab_dir: Path, state: dict[str, Any]) -> None:
        """Make the file systems ready for a lab in ``lab_dir``; record what to undo in ``state``."""
        return  # the host's own Slurm needs nothing

    def detach(self, state: dict[str, Any]) -> None:
        """Undo :meth:`attach` (idempotent, also after a crash)."""
        return

    @abc.abstractmethod
    def set_hosts(self, lines: Sequence[str]) -> None:
        """Make the lab's names resolvable for Slurm and the hooks (``lines``: ``<addr> <name>``)."""

    def clear_hosts(self) -> None:
        """Forget the lab's names again (where :meth:`set_hosts` changed something that outlives the lab)."""
        return

    def clean_leftovers(self) -> None:
        """Remove what a crashed lab with these names left and did not record (found by name)."""
        return

    @abc.abstractmethod
    def start_munge(self) -> ProcRecord | None:
        """Make munge answer; return the munged this call started, if any."""

    def extra_files(self) -> dict[str, str]:
        """Return configuration files beside slurm.conf this version needs (name: text)."""
        return {}


# ---------------------------------------------------------------------------------------------------------


def _edit_hosts(path: Path, mark: str, add: Sequence[str]) -> None:
    """Drop every line of a hosts file marked ``mark`` and append ``add`` (each gets the mark), atomically."""
    old = path.read_text() if path.exists() else ""
    kept = [ln for ln in old.splitlines(keepends=True) if mark not in ln]
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    new = "".join(kept) + "".join(f"{ln} {mark}\n" for ln in add)
    if new == old:
        return
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    try:
        atomic_write(path, new, mode=mode)
    except OSError as exc:
        # /etc/hosts bind-mounted by a container runtime cannot be renamed over: rewrite it in place
        if exc.errno not in (errno.EBUSY, errno.EXDEV):
            raise
        path.write_text(new)


def _read_pid(pidfile: Path) -> str | None:
    """Return the pid a daemon wrote, or None while the file is missing or empty."""
    try:
        return pidfile.read_text().strip() or None
    except FileNotFoundError:
        return None


class HostSlurm(SlurmInstall):
    """The host's Slurm (Debian 12: 22.05.8) and the host's munged."""

    kind = "host"
    NAMES = LabNames(prefix="imxlab", bridge="imxlab0", subnet="198.18.0", ctl_port=6817)

    def __init__(self, names: LabNames = NAMES) -> None:
        super().__init__(names)

    def problems(self) -> list[str]:
        tools = (*self.binaries, "munged", "ip", "nsenter", "unshare", "hostname", "runuser")
        missing = [b for b in tools if shutil.which(b, path=SYS_PATH) is None]
        if missing:
            return [
                (
                    f"missing binaries: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client "
                    "munge iproute2 util-linux hostname)"
                )
            ]
        return []

    def command(self, argv: Sequence[str], user: User = None, cwd: str | None = None) -> Command:
        kw: dict[str, Any] = {"cwd": cwd}
        if user is not None:
            kw.update(user=user[0], group=user[1], extra_groups=[])
        return list(argv), kw

    def daemon(self, hostname: str, argv: Sequence[str]) -> list[str]:
        return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]

    def set_hosts(self, lines: Sequence[str]) -> None:
        _edit_hosts(HOSTS, f"# {self.names.prefix}-managed", lines)

    def clear_hosts(self) -> None:
        _edit_hosts(HOSTS, f"# {self.names.prefix}-managed", [])

    def clean_leftovers(self) -> None:
        self.clear_hosts()

    def start_munge(self) -> ProcRecord | None:
        if sh(["munge", "-n"], check=False, timeout=10).returncode == 0:
            return None
        run_dir = Path("/run/munge")
        run_dir.mkdir(mode=0o755, exist_ok=True)
        sh(["chown", "munge:munge", str(run_dir)])
        pidfile = run_dir / "munged.pid"
        pidfile.unlink(missing_ok=True)
        sh(["runuser", "-u", "munge", "--", "munged"])
        wait_for(lambda: sh(["munge", "-n"], check=False, timeout=10).returncode == 0, 10, what="munged to answer")
        return proc_record(int(wait_for(lambda: _read_pid(pidfile), 5, what="munged.pid")))


# ---------------------------------------------------------------------------------------------------------


class RootSlurm(SlurmInstall):
    """Slurm from a Debian root (Debian 13: 24.11.5; Debian sid: 26.05.5), run through a per-lab overlay of it."""

    kind = "root"
    #: the names of each Slurm series' lab (debroot.SUITES gives its Debian suite): two can be up at once
    SERIES_NAMES = {
        "24.11": LabNames(prefix="imx24", bridge="imx24br0", subnet="198.18.1", ctl_port=6827, first_job_id=100000),
        "26.05": LabNames(prefix="imx26", bridge="imx26br0", subnet="198.18.3", ctl_port=6837, first_job_id=200000),
    }
    NAMES = SERIES_NAMES["24.11"]

    def __init__(self, root: Path, names: LabNames = NAMES, repo: Path = debroot.REPO) -> None:
        super().__init__(names)
        self.root = Path(root)
        self.repo = Path(repo)  # the checkout whose imexctl and hooks run inside the root
        self.merged: Path | None = None

    def problems(self) -> list[str]:
        problems = debroot.build_problems()
        tools = ("ip", "nsenter", "unshare", "hostname", "mount", "umount")
        missing = [b for b in tools if shutil.which(b, path=SYS_PATH) is None]
        missing += [
            f"{b} in {self.root}"
            for b in self.binaries
            if not any((self.root / d / b).exists() for d in ("usr/bin", "usr/sbin"))
        ]
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if "overlay" not in Path("/proc/filesystems").read_text():
            problems.append("the kernel has no overlay file system")
        return problems

    def to_state(self) -> dict[str, Any]:
        return dict(
            super().to_state(),
            root=str(self.root),
            repo=str(self.repo),
            merged=str(self.merged) if self.merged else None,
        )

    def _inside(self) -> Path:
        if self.merged is None:
            raise LabError("the root is not attached to a lab")
        return self.merged

    def command(self, argv: Sequence[str], user: User = None, cwd: str | None = None) -> Command:
        spec = [f"--userspec={user[0]}:{user[1]}", "--groups="] if user is not None else []
        where = ["/usr/bin/env", "-C", cwd] if cwd else []
        return ["chroot", *spec, str(self._inside()), *where, *argv], {"cwd": "/"}

    def daemon(self, hostname: str, argv: Sequence[str]) -> list[str]:
        return [
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            hostname,
            "chroot",
            str(self._inside()),
            *argv,
        ]

    def path_inside(self, path: Path) -> Path:
        if path == self.repo or self.repo in path.parents:
            return Path(debroot.SRC) / path.relative_to(self.repo)
        return path

    def extra_files(self) -> dict[str, str]:
        # slurmd 24.11 refuses to start without a cgroup file system unless told not to use cgroups
        return {"cgroup.conf": "CgroupPlugin=disabled\n"}

    def attach(self, lab_dir: Path, state: dict[str, Any]) -> None:
        top = lab_dir / "root"
        for sub in ("upper", "work", "merged"):
            (top / sub).mkdir(parents=True, exist_ok=True)
        merged = top / "merged"
        state["mount_top"] = str(top)
        self.merged = merged
        # a private mount above everything else: on a host whose / is shared (systemd), the mounts below
        # then never propagate to other mount namespaces, nor theirs to ours
        self._mount(["--bind", str(top)], top)
        self._mount(
            ["-t", "overlay", "overlay", "-o", f"lowerdir={self.root},upperdir={top / 'upper'},workdir={top / 'work'}"],
            merged,
        )
        self._mount(["-t", "proc", "proc"], merged / "proc")
        self._mount(["-t", "sysfs", "-o", "ro", "sysfs"], merged / "sys")
        self._mount(["--bind", "/dev"], merged / "dev")
        self._mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], merged / "run")
        inner_lab = merged / str(lab_dir).lstrip("/")
        inner_lab.mkdir(parents=True, exist_ok=True)
        self._mount(["--bind", str(lab_dir)], inner_lab)
        self._mount(["--bind", str(self.repo)], merged / debroot.SRC.lstrip("/"))

    _mount = staticmethod(mount_private)

    def detach(self, state: dict[str, Any]) -> None:
        top = state.get("mount_top")
        if not top:
            return
        merged = Path(top) / "merged"
        # munged, slurmscriptd and anything a job left: every process whose root is the overlay
        terminate([proc_record(p) for p in processes_rooted_at(merged) if p != os.getpid()], grace=3)
        errors = unmount_all(Path(top))
        left = mountpoints_under(Path(top))
        if left:
            raise LabError(f"mounts left under {top}: {left} ({'; '.join(errors)})")
        self.merged = None

    def clean_leftovers(self) -> None:
        # overlays of labs in the default place, /tmp/<prefix>-XXXX/root
        tops = {
            "/".join(p.split("/")[:4])
            for p in mountpoints_under(Path("/tmp"))
            if p.startswith(f"/tmp/{self.names.prefix}-") and p.split("/")[3:4] == ["root"]
        }
        for top in sorted(tops):
            self.detach({"mount_top": top})

    def set_hosts(self, lines: Sequence[str]) -> None:
        # client commands run in the host's UTS namespace: slurmctld resolves their host name to answer srun
        # (without it srun waits ~10 s per job and steps cannot report completion); the bridge address
        # reaches the host from every namespace of the lab
        host = socket.gethostname()
        own = [f"{self.names.subnet}.1 {host}"] if host not in {ln.split()[-1] for ln in lines} | {"localhost"} else []
        text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        atomic_write(self._inside() / "etc" / "hosts", text + "".join(f"{ln}\n" for ln in [*lines, *own]))

    def start_munge(self) -> ProcRecord | None:
        inside = self._inside()
        run = ["chroot", str(inside)]
        sh([*run, "install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"])
        sh([*run, "runuser", "-u", "munge", "--", "/usr/sbin/munged"])
        pidfile = inside / "run" / "munge" / "munged.pid"
        pid = int(wait_for(lambda: _read_pid(pidfile), 10, what="munged.pid in the root"))
        wait_for(
            lambda: sh([*run, "munge", "-n"], check=False, timeout=10).returncode == 0,
            10,
            what="munged in the root to answer",
        )
        return proc_record(pid)


def install_from_state(state: dict[str, Any]) -> SlurmInstall:
    """Rebuild the install recorded by :meth:`SlurmInstall.to_state` (for teardown from another process)."""
    names = LabNames(**state["names"])
    if state["kind"] == HostSlurm.kind:
        return HostSlurm(names)
    if state["kind"] == RootSlurm.kind:
        install = RootSlurm(Path(state["root"]), names, Path(state.get("repo", debroot.REPO)))
        install.merged = Path(state["merged"]) if state.get("merged") else None
        return install
    raise LabError(f"unknown Slurm install kind {state['kind']!r}")
