"""SlurmLab: one slurmctld and N slurmds in network namespaces, running this checkout's hooks.

slurmctld listens in the root network namespace on ``<subnet>.1`` (the bridge); node ``nodeI`` runs its
slurmd in namespace ``<prefix>-nI`` at ``<subnet>.(10+I)``, with its own UTS hostname, so that real slurmd
runs ``hooks/prolog`` and ``hooks/epilog`` on every node of a job (the recipe and its pitfalls:
shared/reference/slurm-lab.md beside the repository). Which Slurm runs, and how, is the
:class:`~tests.lab.versions.SlurmInstall` given to the lab.

Everything a lab creates is recorded (pids with their start times, namespaces, links, mounts, hosts
lines) in ``<dir>/lab.json`` and ``/run/<prefix>.json``; ``down`` removes exactly that, idempotently.
``up`` first removes a stale lab with the same names left by a crashed or finished run, but refuses
while another live process owns one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from imexctl.platform.fsutil import atomic_write
from tests.lab.debroot import TEST_GID, TEST_UID, TEST_USER
from tests.lab.procs import (
    SYS_PATH,
    LabError,
    ProcRecord,
    mountpoints_under,
    netns_pids,
    proc_alive,
    proc_record,
    proc_start_time,
    sh,
    terminate,
)
from tests.lab.versions import LabNames, SlurmInstall, install_from_state
from tests.simhelpers import wait_for

__all__ = [
    "TEST_GID",
    "TEST_UID",
    "TEST_USER",
    "LabBusy",
    "LabError",
    "LabUnavailable",
    "SlurmLab",
    "build_network",
    "delete_link",
    "kill_netns",
    "slurm_conf",
]

CTL_NAME = "ctl"
STATE_NAME = "lab.json"
REPO = Path(__file__).resolve().parents[2]
IMEXCTL_PREFIX = Path("/opt/imexctl")
MAX_NODES = 200


class LabUnavailable(LabError):
    """This machine cannot run the lab (not root, no network namespaces, Slurm missing)."""


class LabBusy(LabError):
    """Another live process owns a lab with the same names on this machine."""


def log(msg: str) -> None:
    """Print a progress line for humans on stderr (silenced by IMXLAB_QUIET=1)."""
    if os.environ.get("IMXLAB_QUIET") != "1":
        print(f"[lab] {msg}", file=sys.stderr, flush=True)


def link_exists(name: str) -> bool:
    """Say whether a network interface exists in the root namespace."""
    return Path(f"/sys/class/net/{name}").exists()


def build_network(
    bridge: str,
    bridge_addr: str,
    members: Sequence[tuple[str, str, str]],
    state: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """Make a bridge at ``bridge_addr``/24 and, per (namespace, veth, address), a namespace on it as eth0.

    Each link and namespace goes into ``state["links"]`` / ``state["netns"]`` (and ``save()``) as soon as it
    exists, so a teardown after a failure removes exactly what was made.
    """
    sh(["ip", "link", "add", bridge, "type", "bridge"])
    state["links"].append(bridge)
    save()
    sh(["ip", "addr", "add", f"{bridge_addr}/24", "dev", bridge])
    sh(["ip", "link", "set", bridge, "up"])
    for ns, veth, addr in members:
        sh(["ip", "netns", "add", ns])
        state["netns"].append(ns)
        save()
        sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        state["links"].append(veth)
        save()
        sh(["ip", "link", "set", veth, "master", bridge])
        sh(["ip", "link", "set", veth, "up"])
        sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
        sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
        sh(["ip", "-n", ns, "link", "set", "lo", "up"])


def delete_link(link: str) -> None:
    """Delete a network interface of the root namespace if it still exists."""
    # a veth vanishes with its namespace, possibly just after we looked
    if link_exists(link) and sh(["ip", "link", "del", link], check=False).returncode != 0 and link_exists(link):
        sh(["ip", "link", "del", link])


def kill_netns(ns: str) -> None:
    """SIGTERM, then SIGKILL, every process inside one of the lab's namespaces."""
    recs = [proc_record(p) for p in netns_pids(ns) if proc_start_time(p) is not None]
    terminate(recs, grace=3)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """Serialise bring-up and teardown of the labs that share ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def netns_problems(names: LabNames) -> list[str]:
    """Return why network namespaces cannot be made here (empty when they can)."""
    probe = f"{names.prefix}-probe"
    res = sh(["ip", "netns", "add", probe], check=False)
    sh(["ip", "netns", "del", probe], check=False)
    if res.returncode != 0 and "File exists" not in res.stderr:
        return [f"network namespaces unavailable: {res.stderr.strip()}"]
    return []


SLURM_FILES = (
    "StateSaveLocation",
    "SlurmctldPidFile",
    "SlurmctldLogFile",
    "SlurmdSpoolDir",
    "SlurmdPidFile",
    "SlurmdLogFile",
)


def slurm_conf(
    *,
    cluster: str,
    ctl: tuple[str, str],
    ctl_port: int,
    slurm_user: str,
    files: Mapping[str, str],
    slurmd_debug: str,
    prolog: str,
    epilog: str,
    prolog_epilog_timeout: int,
    nodes: Sequence[tuple[str, str]],
    first_job_id: int = 1,
    extra: str = "",
    prolog_flags: str = "Alloc,DeferBatch",
) -> str:
    """Return a lab's slurm.conf: ``ctl`` and ``nodes`` are (name, address); ``files`` has every SLURM_FILES key.

    ``extra`` (lines such as ``TaskProlog=...``) goes at the end; ``prolog_flags`` is ``PrologFlags`` (the README's).
    """
    node_lines = "\n".join(f"NodeName={n} NodeAddr={a} NodeHostname={n}" for n, a in nodes)
    file_lines = "\n".join(f"{k}={files[k]}" for k in SLURM_FILES)
    return f"""\
# generated by tests/lab/cluster.py
ClusterName={cluster}
SlurmctldHost={ctl[0]}({ctl[1]})
SlurmUser={slurm_user}
AuthType=auth/munge
CredType=cred/munge
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# after a het job the backfill scheduler shows its nodes PLANNED until its next cycle (30 s by default)
SchedulerParameters=bf_interval=2
ReturnToService=2
SlurmctldPort={ctl_port}
SlurmdPort=6818
FirstJobId={first_job_id}
{file_lines}
LogTimeFormat=iso8601_ms
SlurmctldDebug=info
SlurmdDebug={slurmd_debug}
SlurmdParameters=config_overrides
Prolog={prolog}
Epilog={epilog}
PrologFlags={prolog_flags}
PrologEpilogTimeout={prolog_epilog_timeout}
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=DEFAULT CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=512 State=UNKNOWN
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
# Slurm's default OverSubscribe=NO: a plain job may share its nodes with other jobs on other cores
PartitionName=shared Nodes=ALL Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO
{extra}"""


class SlurmLab:
    """A Slurm cluster of ``nodes`` slurmds in network namespaces, running this checkout's hooks."""

    def __init__(
        self,
        slurm: SlurmInstall,
        workdir: os.PathLike[str] | None = None,
        nodes: int = 4,
        prolog: os.PathLike[str] | None = None,
        epilog: os.PathLike[str] | None = None,
        slurmd_debug: str = "debug",
        prolog_epilog_timeout: int = 30,
        owner_pid: int | None = None,
        task_prolog: os.PathLike[str] | None = None,
    ) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}")
        self.slurm = slurm
        self.names = slurm.names
        self._dir = Path(workdir) if workdir else None
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self.prolog = Path(prolog) if prolog else REPO / "hooks" / "prolog"
        self.epilog = Path(epilog) if epilog else REPO / "hooks" / "epilog"
        self.slurmd_debug = slurmd_debug
        self.prolog_epilog_timeout = prolog_epilog_timeout
        self.owner_pid = owner_pid
        self.task_prolog = Path(task_prolog) if task_prolog else None
        #: slurm.conf lines beyond the defaults and files beside slurm.conf (set before :meth:`up`, or :meth:`restart`)
        self.extra_conf = ""
        self.extra_etc: dict[str, str] = {}
        #: slurm.conf's PrologFlags (set by :meth:`restart`)
        self.prolog_flags = "Alloc,DeferBatch"
        self.state: dict[str, Any] = {}
        self._popens: list[subprocess.Popen[bytes]] = []

    # -- names and paths ----------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        """The lab directory (exists once ``up`` has started)."""
        if self._dir is None:
            raise LabError("the lab has no directory yet")
        return self._dir

    def netns(self, node: str) -> str:
        """Return the network namespace name of a node."""
        return f"{self.names.prefix}-n{node[4:]}"

    def veth(self, node: str) -> str:
        """Return the root-side veth name of a node."""
        return f"{self.names.prefix}-v{node[4:]}"

    def addr(self, node: str) -> str:
        """Return a node's IPv4 address."""
        return f"{self.names.subnet}.{10 + int(node[4:])}"

    @property
    def ctl_addr(self) -> str:
        """slurmctld's address, on the bridge."""
        return f"{self.names.subnet}.1"

    @property
    def conf(self) -> Path:
        """The lab's slurm.conf."""
        return self.dir / "etc" / "slurm.conf"

    @property
    def imexctl_conf(self) -> Path:
        """The lab's imexctl.conf, next to slurm.conf (imexctl finds it through $SLURM_CONF)."""
        return self.dir / "etc" / "imexctl.conf"

    @property
    def sim_launcher(self) -> Path:
        """The simulated daemon as imexctl runs it: sets IMEX_SIM_FAULTS_FILE, then execs nvidia-imex-sim."""
        return self.dir / "bin" / "nvidia-imex-sim"

    @property
    def faults(self) -> Path:
        """The simulator's fault file (read by each simulated daemon when it starts)."""
        return self.dir / "faults"

    def node_root(self, node: str) -> Path:
        """Return the per-node root that imexctl uses (``[paths] root = <LAB>/nodes/%n``)."""
        return self.dir / "nodes" / node

    def slurmd_log(self, node: str) -> Path:
        """Return a node's slurmd log file."""
        return self.dir / "log" / f"slurmd-{node}.log"

    @property
    def slurmctld_log(self) -> Path:
        """The slurmctld log file."""
        return self.dir / "log" / "slurmctld.log"

    @property
    def env(self) -> dict[str, str]:
        """An environment for Slurm client commands talking to this lab."""
        return {"PATH": SYS_PATH, "LANG": "C", "SLURM_CONF": str(self.conf)}

    def slurmd_pid(self, node: str) -> int:
        """Return the pid of a node's slurmd."""
        return int(self.state["pids"][node]["pid"])

    @property
    def slurmctld_pid(self) -> int:
        """The pid of slurmctld."""
        return int(self.state["pids"]["slurmctld"]["pid"])

    @property
    def version(self) -> str:
        """The running Slurm's version, e.g. ``22.05.8`` (from ``slurmd -V`` at bring-up)."""
        return str(self.state["version"])

    @property
    def version_info(self) -> tuple[int, int]:
        """(major, minor) of the running Slurm, e.g. (24, 11)."""
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    # -- commands -----------------------------------------------------------------------------------

    def _command(
        self,
        argv: Sequence[str],
        user: int | None,
        cwd: os.PathLike[str] | None,
        env: Mapping[str, str] | None,
    ) -> tuple[list[str], dict[str, Any]]:
        ids = None
        if user is not None:
            pw = pwd.getpwuid(user)
            ids = (pw.pw_uid, pw.pw_gid)
        full, kw = self.slurm.command(argv, ids, str(cwd or self.dir / "out"))
        kw.update(env=dict(self.env, **(env or {})), stdin=subprocess.DEVNULL)
        return full, kw

    def run(
        self,
        argv: Sequence[str],
        check: bool = True,
        timeout: float = 60,
        user: int | None = None,
        cwd: os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against the lab, optionally as another uid (its primary gid too)."""
        full, kw = self._command(argv, user, cwd, env)
        res = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False, **kw)
        if check and res.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def spawn(
        self,
        argv: Sequence[str],
        user: int | None = None,
        cwd: os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """Start a Slurm client command against the lab in the background, text output captured."""
        full, kw = self._command(argv, user, cwd, env)
        return subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    def node_exec(
        self,
        node: str,
        argv: Sequence[str],
        check: bool = True,
        timeout: float = 30,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command as root on a node: in its network namespace, with its Slurm's file system."""
        inner, _kw = self.slurm.command(argv)
        full = ["nsenter", f"--net=/run/netns/{self.netns(node)}", *inner]
        return sh(full, check=check, timeout=timeout, env=dict(self.env, **(env or {})))

    def node_states(self) -> dict[str, dict[str, str]]:
        """Return {node: {"state": short state, "reason": reason}} from sinfo."""
        res = self.run(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], check=False, timeout=15)
        out: dict[str, dict[str, str]] = {}
        if res.returncode != 0:
            return out
        for line in res.stdout.splitlines():
            name, state, reason = ([*line.split("|", 2), "", ""])[:3]
            out[name.strip()] = {"state": state.strip(), "reason": reason.strip()}
        return out

    def wait_idle(self, nodes: Sequence[str] | None = None, timeout: float = 30) -> None:
        """Wait until every given node (default: all) is exactly ``idle`` in sinfo."""
        want = list(nodes or self.nodes)

        def idle() -> bool:
            self.check_daemons()
            st = self.node_states()
            return all(st.get(n, {}).get("state") == "idle" for n in want)

        wait_for(idle, timeout, what=f"nodes {','.join(want)} idle")

    def job(self, jobid: int) -> dict[str, str]:
        """Return the job's ``JobState``, ``Reason``, ``Restarts`` and ``NodeList`` (empty once it is purged).

        Read with ``squeue --Format`` over fields no user writes: ``scontrol show job -o`` puts the job's
        name, comment and paths among its fields, and the lab submits jobs whose name or comment says
        ``JobState=CANCELLED``. ``Reason`` is as scontrol prints it (blanks as ``_``).
        """
        spec = "JobId:0|,State:0|,Reason:0|,RestartCnt:0|,NodeList:0|"
        argv = ["squeue", "--noheader", "--all", "--local", "--states=all", f"--jobs={jobid}", f"--Format={spec}"]
        res = self.run(argv, check=False, timeout=15)
        for line in res.stdout.splitlines() if res.returncode == 0 else []:
            fields = line.split("|")
            if len(fields) == 6 and fields[0] == str(jobid):
                keys = ("JobId", "JobState", "Reason", "Restarts", "NodeList")
                return dict(zip(keys, [*fields[:2], fields[2].replace(" ", "_"), *fields[3:5]]))
        return {}

    def check_daemons(self) -> None:
        """Raise with the log tails if slurmctld or a slurmd has died."""
        dead = [k for k, rec in self.state.get("pids", {}).items() if not proc_alive(rec)]
        if dead:
            raise LabError(f"lab daemons died: {', '.join(dead)}\n{self.log_tails(dead)}")

    def log_tails(self, which: Sequence[str] = (), lines: int = 15) -> str:
        """Return the last lines of the given daemons' logs and stdio files."""
        parts = []
        for name in which:
            stem = "slurmctld" if name == "slurmctld" else f"slurmd-{name}"
            for f in (self.dir / "log" / f"{stem}.log", self.dir / "log" / f"{stem}.out"):
                if f.exists():
                    tail = f.read_text(errors="replace").splitlines()[-lines:]
                    parts.append(f"--- {f}\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- state --------------------------------------------------------------------------------------

    def _save(self) -> None:
        """Record the lab's state in its directory and in the machine-wide pointer."""
        self.state["slurm"] = self.slurm.to_state()
        text = json.dumps(self.state, indent=1, sort_keys=True) + "\n"
        if self._dir and self._dir.is_dir():
            atomic_write(self._dir / STATE_NAME, text)
        atomic_write(self.names.pointer, text)

    @classmethod
    def attach(cls, names: LabNames, workdir: os.PathLike[str] | None = None) -> SlurmLab:
        """Return a lab object for an existing lab (by directory, or the current one with these names)."""
        state = None
        if workdir is not None and (Path(workdir) / STATE_NAME).exists():
            state = json.loads((Path(workdir) / STATE_NAME).read_text())
        elif names.pointer.exists():
            state = json.loads(names.pointer.read_text())
            if workdir is not None and Path(state["dir"]) != Path(workdir):
                raise LabError(f"{workdir} is not a lab (the current lab is {state['dir']})")
        if state is None:
            raise LabError("no lab found" + (f" in {workdir}" if workdir else f" named {names.prefix}"))
        lab = cls(
            install_from_state(state["slurm"]),
            state["dir"],
            nodes=len(state["nodes"]),
            prolog=state.get("prolog"),
            epilog=state.get("epilog"),
        )
        lab.state = state
        return lab

    # -- bring-up -----------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Return why this machine cannot run the lab (empty when it can)."""
        if os.geteuid() != 0:
            return ["not root (the lab needs network namespaces, mounts and slurmd as root)"]
        return self.slurm.problems() or netns_problems(self.names)

    def up(self, timeout: float = 60) -> SlurmLab:
        """Bring the lab up (cleaning a stale one first) and wait until every node is idle."""
        problems = self.problems()
        if problems:
            raise LabUnavailable("; ".join(problems))
        t0 = time.monotonic()
        with _flock(self.names.lock):
            self._clean_stale()
            self._make_dir()
            self.state = {
                "dir": str(self.dir),
                "nodes": self.nodes,
                "owner_pid": self.owner_pid,
                "owner_start": proc_start_time(self.owner_pid) if self.owner_pid else None,
                "prolog": str(self.prolog),
                "epilog": str(self.epilog),
                "netns": [],
                "links": [],
                "hosts": False,
                "munged": None,
                "pids": {},
                "fs": {},
            }
            self._save()
            try:
                self._bring_up()
            except BaseException:
                log("bring-up failed, tearing down")
                with contextlib.suppress(Exception):
                    sys.stderr.write(self.log_tails(["slurmctld", *self.nodes]) + "\n")
                self._down_locked()
                raise
        try:
            self.wait_idle(timeout=max(5.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            tails = self.log_tails(["slurmctld", *self.nodes])
            self.down()
            raise LabError(f"lab did not come up:\n{tails}") from None
        self.state["up_s"] = round(time.monotonic() - t0, 3)
        self._save()
        log(f"lab up in {self.state['up_s']:.2f}s: {self.dir} ({len(self.nodes)} nodes, Slurm {self.version})")
        return self

    def _make_dir(self) -> None:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"{self.names.prefix}-", dir="/tmp"))
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        if any(self._dir.iterdir()):
            raise LabError(f"{self._dir} is not empty")

    def _bring_up(self) -> None:
        self._write_files()
        self.slurm.attach(self.dir, self.state["fs"])
        self._save()
        self.state["munged"] = self.slurm.start_munge()
        self._save()
        self.state["version"] = self._slurm_version()
        self._network()
        self._start_daemons()

    def _slurm_version(self) -> str:
        # "slurm 22.05.8" / "slurm-wlm 24.11.5"
        return self.run(["slurmd", "-V"], cwd=self.dir, timeout=15).stdout.split()[-1]

    def remove_stale(self) -> None:
        """Remove a lab with these names whose owner is gone, and leftovers by name (``down`` without a lab)."""
        with _flock(self.names.lock):
            self._clean_stale()

    def _clean_stale(self) -> None:
        """Tear down a lab with our names whose owner is gone, and leftovers by name; refuse if the owner lives."""
        pointer = self.names.pointer
        if pointer.exists():
            try:
                state = json.loads(pointer.read_text())
            except ValueError:
                state = None
            if state:
                owner = state.get("owner_pid")
                if owner and proc_start_time(owner) == state.get("owner_start") and owner != os.getpid():
                    raise LabBusy(f"a lab in {state['dir']} is owned by live process {owner}")
                log(f"removing previous lab {state['dir']}")
                stale = SlurmLab.attach(self.names, state["dir"] if Path(state["dir"], STATE_NAME).exists() else None)
                stale._down_locked()
        # leftovers of a run that crashed before it recorded them
        prefix = self.names.prefix
        for name in sh(["ip", "netns", "list"], check=False).stdout.split():
            if name.startswith(f"{prefix}-n"):
                self._kill_netns(name)
                sh(["ip", "netns", "del", name], check=False)
        for link in sorted(os.listdir("/sys/class/net")):
            if link.startswith(f"{prefix}-v") or link == self.names.bridge:
                sh(["ip", "link", "del", link], check=False)
        self.slurm.clean_leftovers()

    def _write_files(self) -> None:
        """Write slurm.conf, imexctl.conf and the per-node roots."""
        d = self.dir
        os.chmod(d, 0o755)  # the job user reads slurm.conf and walks the node roots
        for sub in ("etc", "state", "run", "log", "nodes"):
            (d / sub).mkdir(mode=0o755)
        (d / "out").mkdir()
        os.chmod(d / "out", 0o1777)  # job output and cwd of srun/sbatch for any user
        for node in self.nodes:
            (d / "spool" / node).mkdir(parents=True)
            proc = self.node_root(node) / "proc"
            proc.mkdir(parents=True)
            (proc / "devices").write_text(
                "Character devices:\n  1 mem\n  4 tty\n195 nvidia\n234 nvidia-caps-imex-channels\n"
                "235 nvidia-caps\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
            )
        self.faults.write_text("")
        self.conf.write_text(self._slurm_conf())
        # the files set before ``up`` (``extra_etc``, e.g. a topology.conf) beside slurm.conf, as restart writes them
        for name, text in {**self.slurm.extra_files(), **self.extra_etc}.items():
            (d / "etc" / name).write_text(text)
        self.imexctl_conf.write_text(self._imexctl_conf())
        for f in d.rglob("*"):
            if f.is_dir() and f != d / "out":
                os.chmod(f, 0o755)
            elif f.is_file():
                os.chmod(f, 0o644)
        # the simulator takes its faults from its environment, never from the config imexctl writes
        self.sim_launcher.parent.mkdir(mode=0o755, exist_ok=True)
        self.sim_launcher.write_text(
            f'#!/bin/sh\nIMEX_SIM_FAULTS_FILE={self.faults} exec {IMEXCTL_PREFIX}/bin/nvidia-imex-sim "$@"\n'
        )
        os.chmod(self.sim_launcher, 0o755)

    def _slurm_conf(self) -> str:
        d = self.dir
        return slurm_conf(
            cluster="imxlab",
            ctl=(CTL_NAME, self.ctl_addr),
            ctl_port=self.names.ctl_port,
            slurm_user="root",
            files={
                "StateSaveLocation": f"{d}/state",
                "SlurmctldPidFile": f"{d}/run/slurmctld.pid",
                "SlurmctldLogFile": f"{d}/log/slurmctld.log",
                "SlurmdSpoolDir": f"{d}/spool/%n",
                "SlurmdPidFile": f"{d}/run/slurmd-%n.pid",
                "SlurmdLogFile": f"{d}/log/slurmd-%n.log",
            },
            slurmd_debug=self.slurmd_debug,
            prolog=str(self.slurm.path_inside(self.prolog)),
            epilog=str(self.slurm.path_inside(self.epilog)),
            prolog_epilog_timeout=self.prolog_epilog_timeout,
            nodes=[(n, self.addr(n)) for n in self.nodes],
            first_job_id=self.names.first_job_id,
            extra=self._extra_lines(),
            prolog_flags=self.prolog_flags,
        )

    def _extra_lines(self) -> str:
        task = f"TaskProlog={self.slurm.path_inside(self.task_prolog)}\n" if self.task_prolog else ""
        return task + self.extra_conf

    def _imexctl_conf(self) -> str:
        return f"""\
# generated by tests/lab/cluster.py
[paths]
# %n expands to the Slurm node name (SLURMD_NODENAME), so each node gets its own root
root = {self.dir}/nodes/%n
[commands]
nvidia_imex = {self.sim_launcher}
nvidia_imex_ctl = {IMEXCTL_PREFIX}/bin/nvidia-imex-ctl-sim
[daemon]
backend = exec
[policy]
fabric = none
[resolve]
method = dns
[readiness]
deadline_s = 15
"""

    def _network(self) -> None:
        """Create the bridge, one namespace + veth per node, and the names of the lab."""
        ctl = self.ctl_addr
        members = [(self.netns(n), self.veth(n), self.addr(n)) for n in self.nodes]
        build_network(self.names.bridge, ctl, members, self.state, self._save)
        self.state["hosts"] = True
        self._save()
        self.slurm.set_hosts([f"{ctl} {CTL_NAME}"] + [f"{self.addr(n)} {n}" for n in self.nodes])

    def _spawn(self, key: str, argv: list[str], stem: str) -> None:
        """Start a daemon in its own session with stdio on files, and record its pid."""
        with open(self.dir / "log" / f"{stem}.out", "wb") as out:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
                cwd=str(self.dir / "run"),
            )
        self._popens.append(p)
        # nsenter, unshare, sh and chroot all exec, so the pid is the daemon's own
        self.state["pids"][key] = {"pid": p.pid, "start": proc_start_time(p.pid) or 0}
        self._save()

    def _start_daemons(self) -> None:
        """Start slurmctld (hostname ctl) and one slurmd per namespace (hostname nodeX)."""
        conf = str(self.conf)
        self._spawn("slurmctld", self.slurm.daemon(CTL_NAME, ["slurmctld", "-D", "-i", "-f", conf]), "slurmctld")
        for node in self.nodes:
            argv = self.slurm.daemon(node, ["slurmd", "-D", "-N", node, "-f", conf])
            self._spawn(node, ["nsenter", f"--net=/run/netns/{self.netns(node)}", *argv], f"slurmd-{node}")

        self._wait_execed(self.state["pids"])

    def _wait_execed(self, recs: Mapping[str, dict[str, Any]]) -> None:
        """Wait until the daemons just spawned have exec'd into Slurm, and record their real start times."""

        def execed() -> bool:
            # Debian 13 names the binaries slurmctld-wlm / slurmd-wlm; the exec chain is done once comm is slurm*
            for key, rec in recs.items():
                try:
                    comm = Path(f"/proc/{rec['pid']}/comm").read_text().strip()
                except OSError:
                    raise LabError(f"{key} exited at once:\n{self.log_tails([key])}") from None
                if not comm.startswith("slurm"):
                    return False
            return True

        wait_for(execed, 10, what="slurm daemons to start")
        for rec in recs.values():
            rec["start"] = proc_start_time(rec["pid"]) or rec["start"]
        self._save()

    # -- restarts -----------------------------------------------------------------------------------

    def restart(
        self,
        extra_conf: str = "",
        etc: Mapping[str, str] | None = None,
        prolog_epilog_timeout: int | None = None,
        timeout: float = 60,
        prolog_flags: str | None = None,
    ) -> None:
        """Stop every Slurm daemon, rewrite slurm.conf with ``extra_conf`` appended and ``etc`` files beside it
        (and ``PrologEpilogTimeout`` and ``PrologFlags`` when given), start the daemons again and wait until every
        node is idle (the queue should be empty)."""
        pids = self.state["pids"]
        self._stop("slurmds", [pids.pop(n) for n in self.nodes], 2.0)
        self._stop("slurmctld", [pids.pop("slurmctld")])
        self._save()
        for name in self.extra_etc:
            (self.dir / "etc" / name).unlink(missing_ok=True)
        self.extra_conf, self.extra_etc = extra_conf, dict(etc or {})
        if prolog_epilog_timeout is not None:
            self.prolog_epilog_timeout = prolog_epilog_timeout
        if prolog_flags is not None:
            self.prolog_flags = prolog_flags
        for name, text in self.extra_etc.items():
            atomic_write(self.dir / "etc" / name, text, mode=0o644)
        atomic_write(self.conf, self._slurm_conf(), mode=0o644)
        self._start_daemons()
        self.wait_idle(timeout=timeout)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL a node's slurmd (its slurmstepds and jobs live on) and wait until it is gone."""
        rec = self.state["pids"][node]
        os.kill(rec["pid"], 9)
        wait_for(lambda: not proc_alive(rec), 10, what=f"{node}'s slurmd to die")
        for p in self._popens:
            p.poll()

    def start_slurmd(self, node: str) -> None:
        """Start a node's slurmd again (after :meth:`kill_slurmd`)."""
        argv = self.slurm.daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._spawn(node, ["nsenter", f"--net=/run/netns/{self.netns(node)}", *argv], f"slurmd-{node}")
        self._wait_execed({node: self.state["pids"][node]})

    # -- teardown -----------------------------------------------------------------------------------

    def down(self) -> None:
        """Tear everything down that this lab created; safe to call twice or after a failed bring-up."""
        with _flock(self.names.lock):
            self._down_locked()

    def _down_locked(self) -> None:
        t0 = time.monotonic()
        st = self.state
        if not st:
            return
        errors: list[str] = []

        def step(what: str, fn: Callable[[], Any]) -> None:
            try:
                fn()
            except Exception as exc:  # keep tearing down; report at the end
                errors.append(f"{what}: {exc}")

        pids = st.get("pids", {})
        # slurmds first: a slurmd whose controller is gone retries its RPCs before it exits. A slurmd that is
        # retrying an RPC ("Retrying prolog complete RPC ... [sleeping 15s]") ignores SIGTERM until that sleep
        # ends: SIGKILL after a short grace is harmless here
        step("stop slurmds", lambda: self._stop("slurmds", [r for k, r in pids.items() if k != "slurmctld"], 2.0))
        step("stop slurmctld", lambda: self._stop("slurmctld", [pids["slurmctld"]] if "slurmctld" in pids else []))
        for ns in st.get("netns", []):
            # slurmstepd, job tasks and the simulated IMEX daemons all live in the node namespaces
            step(f"kill processes in {ns}", functools.partial(self._kill_netns, ns))
            step(f"delete netns {ns}", functools.partial(sh, ["ip", "netns", "del", ns], check=False))
        for link in reversed(st.get("links", [])):
            step(f"delete link {link}", functools.partial(self._delete_link, link))
        if st.get("hosts"):
            step("remove the lab's names", self.slurm.clear_hosts)
        if st.get("munged"):
            step("stop munged", lambda: terminate([st["munged"]]))
        step("detach the file systems", lambda: self.slurm.detach(st.get("fs", {})))
        for p in self._popens:
            p.poll()  # reap the daemons we started (zombies count as gone anyway)
        d = Path(st["dir"])
        if mountpoints_under(d):
            errors.append(f"not removing {d}: mounts left under it: {mountpoints_under(d)}")
        elif (d / STATE_NAME).exists() and d.resolve() != Path("/"):
            step(f"remove {d}", lambda: shutil.rmtree(d))
        pointer = self.names.pointer
        with contextlib.suppress(ValueError, OSError):
            if json.loads(pointer.read_text()).get("dir") == st["dir"]:
                pointer.unlink()
        self.state = {}
        log(f"lab {d} down in {time.monotonic() - t0:.2f}s")
        if errors:
            raise LabError("teardown incomplete: " + "; ".join(errors))

    @staticmethod
    def _stop(what: str, recs: list[ProcRecord], grace: float = 5.0) -> None:
        t = time.monotonic()
        killed = terminate(recs, grace)
        log(f"stopped {what} in {time.monotonic() - t:.2f}s" + (f" (SIGKILLed {killed})" if killed else ""))

    _delete_link = staticmethod(delete_link)
    _kill_netns = staticmethod(kill_netns)

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Return the recorded state plus daemon liveness and node states."""
        out = dict(self.state)
        out["alive"] = {k: proc_alive(r) for k, r in self.state.get("pids", {}).items()}
        if self.state.get("munged"):
            out["alive"]["munged"] = proc_alive(self.state["munged"])
        out["node_states"] = self.node_states()
        out["netns_present"] = {ns: Path(f"/run/netns/{ns}").exists() for ns in self.state.get("netns", [])}
        return out
