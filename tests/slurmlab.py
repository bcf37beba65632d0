#!/usr/bin/env python3
"""A real multi-node Slurm 22.05 cluster on one machine, for imexctl's integration tests.

One ``slurmctld`` in the root network namespace (198.18.0.1 on the bridge ``imxlab0``) and one ``slurmd``
per network namespace (``imxlab-n1`` .. ``imxlab-nN``, node1.. at 198.18.0.11..), each with its own UTS
hostname, so that real slurmd runs this checkout's ``hooks/prolog`` and ``hooks/epilog`` on every node of
a job (see shared/reference/slurm-lab.md, beside the repository, for the recipe and its pitfalls).

Use it from pytest (``SlurmLab(...).up()`` / ``.down()``) or by hand, as root::

    python3 tests/slurmlab.py up [--nodes N] [--dir D]   # prints the lab dir and SLURM_CONF
    python3 tests/slurmlab.py status [--dir D]
    python3 tests/slurmlab.py down [--dir D]

It installs nothing. Only one lab exists per machine (the bridge, namespace names and subnet are fixed);
``up`` first removes a stale lab left by a crashed or finished run, but refuses while another live process
owns one. Everything the lab creates is recorded (pids with their start times, namespaces, links,
``/etc/hosts`` lines marked ``# imxlab-managed``) in ``<dir>/lab.json`` and ``/run/imxlab.json``, and
``down`` removes exactly that, idempotently.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, TypeVar

PREFIX = "imxlab"
BRIDGE = "imxlab0"
SUBNET = "198.18.0"
CTL_NAME = "ctl"
CTL_ADDR = f"{SUBNET}.1"
POINTER = Path("/run/imxlab.json")
LOCK = Path("/run/imxlab.lock")
HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# imxlab-managed"
STATE_NAME = "lab.json"
SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
REPO = Path(__file__).resolve().parent.parent
IMEXCTL_PREFIX = Path("/opt/imexctl")
TEST_USER = "imexlab"
TEST_UID = 1501
MAX_NODES = 200

REQUIRED_BINARIES = (
    "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "squeue", "scancel",
    "munged", "munge", "ip", "nsenter", "unshare", "hostname", "runuser",
)

T = TypeVar("T")


class LabError(RuntimeError):
    """The lab could not be brought up or torn down."""


class LabUnavailable(LabError):
    """This machine cannot run the lab (not root, no network namespaces, Slurm missing)."""


class LabBusy(LabError):
    """Another live process owns the lab on this machine."""


# ---------------------------------------------------------------------------------------------------------
# small helpers


def log(msg: str) -> None:
    """Print a progress line for humans on stderr."""
    if os.environ.get("IMXLAB_QUIET") != "1":
        print(f"[slurmlab] {msg}", file=sys.stderr, flush=True)


def wait_for(cond: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``cond`` until it returns a truthy value and return it; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def sh(argv: Sequence[str], check: bool = True, timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess:
    """Run a command with captured text output."""
    env = kw.pop("env", None) or {"PATH": SYS_PATH, "LANG": "C"}
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                         stdin=subprocess.DEVNULL, **kw)
    if check and res.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def proc_start_time(pid: int) -> Optional[int]:
    """Return the start time (clock ticks since boot) of a live, non-zombie process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_alive(rec: Optional[Dict[str, int]]) -> bool:
    """Say whether the process recorded as {"pid", "start"} is still the same live process."""
    if not rec:
        return False
    return proc_start_time(rec["pid"]) == rec["start"]


def proc_record(pid: int) -> Dict[str, int]:
    """Record a pid with its start time so that a reused pid is never signalled."""
    start = proc_start_time(pid)
    if start is None:
        raise LabError(f"process {pid} died right after start")
    return {"pid": pid, "start": start}


def terminate(recs: Iterable[Dict[str, int]], grace: float = 5.0) -> List[int]:
    """SIGTERM the recorded processes that are still alive, wait up to ``grace`` s, then SIGKILL the rest."""
    live = [r for r in recs if proc_alive(r)]
    for r in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(proc_alive(r) for r in live):
        time.sleep(0.02)
    killed = []
    for r in live:
        if proc_alive(r):
            killed.append(r["pid"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGKILL)
    if killed:
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not any(proc_alive(r) for r in live), 5, "SIGKILLed processes to die")
    return killed


def netns_pids(name: str) -> List[int]:
    """Return the live processes whose network namespace is the named one (``ip netns pids``, in-process)."""
    try:
        ns = os.stat(f"/run/netns/{name}")
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_ino, st.st_dev) == (ns.st_ino, ns.st_dev) and proc_start_time(int(entry)) is not None:
            pids.append(int(entry))
    return pids


def link_exists(name: str) -> bool:
    """Say whether a network interface exists in the root namespace."""
    return Path(f"/sys/class/net/{name}").exists()


@contextlib.contextmanager
def global_lock():
    """Serialise bring-up and teardown of the one lab of this machine."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str, mode: Optional[int] = None) -> None:
    """Replace a file's content atomically (temp file in the same directory, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.{PREFIX}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def edit_hosts(add: Sequence[str]) -> None:
    """Drop every line of /etc/hosts marked as the lab's and append ``add`` (each gets the mark), atomically."""
    old = HOSTS.read_text() if HOSTS.exists() else ""
    kept = [ln for ln in old.splitlines(keepends=True) if HOSTS_MARK not in ln]
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    new = "".join(kept) + "".join(f"{ln} {HOSTS_MARK}\n" for ln in add)
    if new == old:
        return
    mode = HOSTS.stat().st_mode & 0o7777 if HOSTS.exists() else 0o644
    try:
        write_atomic(HOSTS, new, mode)
    except OSError as exc:
        # /etc/hosts bind-mounted by a container runtime cannot be renamed over: rewrite it in place
        if exc.errno not in (16, 18):  # EBUSY, EXDEV
            raise
        HOSTS.write_text(new)


def preflight() -> List[str]:
    """Return the reasons this machine cannot run the lab (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (the lab needs network namespaces, /etc/hosts and slurmd as root)")
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b, path=SYS_PATH) is None]
    if missing:
        problems.append("missing binaries: " + ", ".join(missing)
                        + " (apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux hostname)")
    if not problems:
        probe = f"{PREFIX}-probe"
        res = sh(["ip", "netns", "add", probe], check=False)
        if res.returncode != 0 and "File exists" not in res.stderr:
            problems.append(f"network namespaces unavailable: {res.stderr.strip()}")
        sh(["ip", "netns", "del", probe], check=False)
    return problems


# ---------------------------------------------------------------------------------------------------------
# the lab


class SlurmLab:
    """A Slurm cluster of ``nodes`` slurmds in network namespaces, running this checkout's hooks."""

    def __init__(self, workdir: Optional[os.PathLike] = None, nodes: int = 4,
                 prolog: Optional[os.PathLike] = None, epilog: Optional[os.PathLike] = None,
                 slurmd_debug: str = "debug", prolog_epilog_timeout: int = 30,
                 owner_pid: Optional[int] = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}")
        self.dir = Path(workdir) if workdir else None
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self.prolog = Path(prolog) if prolog else REPO / "hooks" / "prolog"
        self.epilog = Path(epilog) if epilog else REPO / "hooks" / "epilog"
        self.slurmd_debug = slurmd_debug
        self.prolog_epilog_timeout = prolog_epilog_timeout
        self.owner_pid = owner_pid
        self.state: Dict[str, Any] = {}
        self._popens: List[subprocess.Popen] = []

    # -- names and paths ----------------------------------------------------------------------------

    @staticmethod
    def netns(node: str) -> str:
        """Return the network namespace name of a node."""
        return f"{PREFIX}-n{node[4:]}"

    @staticmethod
    def veth(node: str) -> str:
        """Return the root-side veth name of a node."""
        return f"{PREFIX}-v{node[4:]}"

    @staticmethod
    def addr(node: str) -> str:
        """Return a node's IPv4 address."""
        return f"{SUBNET}.{10 + int(node[4:])}"

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
    def env(self) -> Dict[str, str]:
        """An environment for Slurm client commands talking to this lab."""
        return {"PATH": SYS_PATH, "LANG": "C", "SLURM_CONF": str(self.conf)}

    def slurmd_pid(self, node: str) -> int:
        """Return the pid of a node's slurmd."""
        return self.state["pids"][node]["pid"]

    @property
    def slurmctld_pid(self) -> int:
        """The pid of slurmctld."""
        return self.state["pids"]["slurmctld"]["pid"]

    # -- commands -----------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 60, user: Optional[int] = None,
            cwd: Optional[os.PathLike] = None, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a (Slurm client) command against the lab, optionally as another uid (its primary gid too)."""
        kw: Dict[str, Any] = {}
        if user is not None:
            import pwd
            pw = pwd.getpwuid(user)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        full_env = dict(self.env, **(env or {}))
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=full_env,
                             cwd=str(cwd or self.dir / "out"), stdin=subprocess.DEVNULL, **kw)
        if check and res.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def spawn(self, argv: Sequence[str], user: Optional[int] = None, cwd: Optional[os.PathLike] = None,
              env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        """Start a (Slurm client) command against the lab in the background, text output captured."""
        kw: Dict[str, Any] = {}
        if user is not None:
            import pwd
            pw = pwd.getpwuid(user)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(self.env, **(env or {})), cwd=str(cwd or self.dir / "out"),
                                stdin=subprocess.DEVNULL, **kw)

    def node_exec(self, node: str, argv: Sequence[str], check: bool = True, timeout: float = 30,
                  env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a command as root inside a node's network namespace."""
        full = ["nsenter", f"--net=/run/netns/{self.netns(node)}", *argv]
        return sh(full, check=check, timeout=timeout, env=dict(self.env, **(env or {})))

    def node_states(self) -> Dict[str, Dict[str, str]]:
        """Return {node: {"state": short state, "reason": reason}} from sinfo."""
        res = self.run(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], check=False, timeout=15)
        out: Dict[str, Dict[str, str]] = {}
        if res.returncode != 0:
            return out
        for line in res.stdout.splitlines():
            name, state, reason = (line.split("|", 2) + ["", ""])[:3]
            out[name.strip()] = {"state": state.strip(), "reason": reason.strip()}
        return out

    def wait_idle(self, nodes: Optional[Sequence[str]] = None, timeout: float = 30) -> None:
        """Wait until every given node (default: all) is exactly ``idle`` in sinfo."""
        want = list(nodes or self.nodes)

        def idle() -> bool:
            self.check_daemons()
            st = self.node_states()
            return all(st.get(n, {}).get("state") == "idle" for n in want)
        wait_for(idle, timeout, f"nodes {','.join(want)} idle (sinfo: {self.node_states()})")

    def job(self, jobid: int) -> Dict[str, str]:
        """Return ``scontrol show job -o`` as a dict (empty once the job is purged)."""
        res = self.run(["scontrol", "show", "job", "-o", str(jobid)], check=False, timeout=15)
        if res.returncode != 0:
            return {}
        info: Dict[str, str] = {}
        for tok in res.stdout.split():
            if "=" in tok:
                k, _, v = tok.partition("=")
                info.setdefault(k, v)
        return info

    def check_daemons(self) -> None:
        """Raise with the log tails if slurmctld or a slurmd has died."""
        dead = [k for k, rec in self.state.get("pids", {}).items() if not proc_alive(rec)]
        if dead:
            raise LabError(f"lab daemons died: {', '.join(dead)}\n{self.log_tails(dead)}")

    def log_tails(self, which: Iterable[str] = (), lines: int = 15) -> str:
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
        text = json.dumps(self.state, indent=1, sort_keys=True) + "\n"
        if self.dir and self.dir.is_dir():
            write_atomic(self.dir / STATE_NAME, text)
        write_atomic(POINTER, text)

    @classmethod
    def attach(cls, workdir: Optional[os.PathLike] = None) -> "SlurmLab":
        """Return a lab object for an existing lab (by directory, or the machine's current one)."""
        state = None
        if workdir is not None and (Path(workdir) / STATE_NAME).exists():
            state = json.loads((Path(workdir) / STATE_NAME).read_text())
        elif POINTER.exists():
            state = json.loads(POINTER.read_text())
            if workdir is not None and Path(state["dir"]) != Path(workdir):
                raise LabError(f"{workdir} is not a lab (the current lab is {state['dir']})")
        if state is None:
            raise LabError("no lab found" + (f" in {workdir}" if workdir else ""))
        lab = cls(state["dir"], nodes=len(state["nodes"]), prolog=state.get("prolog"), epilog=state.get("epilog"))
        lab.state = state
        return lab

    # -- bring-up -----------------------------------------------------------------------------------

    def up(self, timeout: float = 60) -> "SlurmLab":
        """Bring the lab up (cleaning a stale one first) and wait until every node is idle."""
        problems = preflight()
        if problems:
            raise LabUnavailable("; ".join(problems))
        t0 = time.monotonic()
        with global_lock():
            self._clean_stale()
            if self.dir is None:
                self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-", dir="/tmp"))
            else:
                self.dir.mkdir(parents=True, exist_ok=True)
                if any(self.dir.iterdir()):
                    raise LabError(f"{self.dir} is not empty")
            self.state = {
                "dir": str(self.dir), "nodes": self.nodes, "owner_pid": self.owner_pid,
                "owner_start": proc_start_time(self.owner_pid) if self.owner_pid else None,
                "prolog": str(self.prolog), "epilog": str(self.epilog),
                "netns": [], "links": [], "hosts": False, "munged": None, "pids": {},
            }
            self._save()
            try:
                self._write_files()
                self._start_munge()
                self._network()
                self._start_daemons()
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
            raise LabError(f"lab did not come up:\n{tails}")
        self.state["up_s"] = round(time.monotonic() - t0, 3)
        self._save()
        log(f"lab up in {self.state['up_s']:.2f}s: {self.dir} ({len(self.nodes)} nodes)")
        return self

    def _clean_stale(self) -> None:
        """Tear down a lab whose owner is gone, and any leftovers by name; refuse if the owner lives."""
        if POINTER.exists():
            try:
                state = json.loads(POINTER.read_text())
            except ValueError:
                state = None
            if state:
                owner = state.get("owner_pid")
                if owner and proc_start_time(owner) == state.get("owner_start") and owner != os.getpid():
                    raise LabBusy(f"a lab in {state['dir']} is owned by live process {owner}")
                log(f"removing previous lab {state['dir']}")
                stale = SlurmLab.attach(state["dir"]) if Path(state["dir"], STATE_NAME).exists() else None
                if stale is None:
                    stale = SlurmLab(state["dir"], nodes=len(state["nodes"]))
                    stale.state = state
                stale._down_locked()
        # leftovers of a run that crashed before it recorded them
        for name in sh(["ip", "netns", "list"], check=False).stdout.split():
            if name.startswith(f"{PREFIX}-n"):
                self._kill_netns(name)
                sh(["ip", "netns", "del", name], check=False)
        for link in sorted(os.listdir("/sys/class/net")):
            if link.startswith(f"{PREFIX}-v") or link == BRIDGE:
                sh(["ip", "link", "del", link], check=False)
        edit_hosts([])

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
                "235 nvidia-caps\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n")
        self.faults.write_text("")
        node_lines = "\n".join(
            f"NodeName={n} NodeAddr={self.addr(n)} NodeHostname={n}" for n in self.nodes)
        self.conf.write_text(f"""\
# generated by tests/slurmlab.py
ClusterName=imxlab
SlurmctldHost={CTL_NAME}({CTL_ADDR})
SlurmUser=root
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
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d}/state
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdSpoolDir={d}/spool/%n
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmdLogFile={d}/log/slurmd-%n.log
LogTimeFormat=iso8601_ms
SlurmctldDebug=info
SlurmdDebug={self.slurmd_debug}
SlurmdParameters=config_overrides
Prolog={self.prolog}
Epilog={self.epilog}
PrologFlags=Alloc,DeferBatch
PrologEpilogTimeout={self.prolog_epilog_timeout}
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=DEFAULT CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=512 State=UNKNOWN
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
""")
        self.imexctl_conf.write_text(f"""\
# generated by tests/slurmlab.py
[paths]
# %n expands to the Slurm node name (SLURMD_NODENAME), so each node gets its own root
root = {d}/nodes/%n
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
""")
        for f in d.rglob("*"):
            if f.is_dir() and f != d / "out":
                os.chmod(f, 0o755)
            elif f.is_file():
                os.chmod(f, 0o644)
        # the simulator takes its faults from its environment, never from the config imexctl writes
        self.sim_launcher.parent.mkdir(mode=0o755, exist_ok=True)
        self.sim_launcher.write_text(f"#!/bin/sh\nIMEX_SIM_FAULTS_FILE={self.faults} "
                                     f"exec {IMEXCTL_PREFIX}/bin/nvidia-imex-sim \"$@\"\n")
        os.chmod(self.sim_launcher, 0o755)

    def _start_munge(self) -> None:
        """Start munged unless one already answers; remember whether we started it."""
        if sh(["munge", "-n"], check=False, timeout=10).returncode == 0:
            return
        run_dir = Path("/run/munge")
        run_dir.mkdir(mode=0o755, exist_ok=True)
        sh(["chown", "munge:munge", str(run_dir)])
        pidfile = run_dir / "munged.pid"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        sh(["runuser", "-u", "munge", "--", "munged"])
        wait_for(lambda: sh(["munge", "-n"], check=False, timeout=10).returncode == 0, 10, "munged to answer")
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 5, "munged.pid"))
        self.state["munged"] = proc_record(pid)
        self._save()
        log(f"started munged (pid {pid})")

    def _network(self) -> None:
        """Create the bridge, one namespace + veth per node, and the /etc/hosts lines."""
        sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        self.state["links"].append(BRIDGE)
        self._save()
        sh(["ip", "addr", "add", f"{CTL_ADDR}/24", "dev", BRIDGE])
        sh(["ip", "link", "set", BRIDGE, "up"])
        for node in self.nodes:
            ns, veth = self.netns(node), self.veth(node)
            sh(["ip", "netns", "add", ns])
            self.state["netns"].append(ns)
            self._save()
            sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            self.state["links"].append(veth)
            self._save()
            sh(["ip", "link", "set", veth, "master", BRIDGE])
            sh(["ip", "link", "set", veth, "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{self.addr(node)}/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.state["hosts"] = True
        self._save()
        edit_hosts([f"{CTL_ADDR} {CTL_NAME}"] + [f"{self.addr(n)} {n}" for n in self.nodes])

    def _spawn(self, key: str, argv: List[str], stem: str) -> None:
        """Start a daemon in its own session with stdio on files, and record its pid."""
        out = open(self.dir / "log" / f"{stem}.out", "wb")
        env = {"PATH": SYS_PATH, "LANG": "C", "SLURM_CONF": str(self.conf)}
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env, cwd=str(self.dir / "run"))
        out.close()
        self._popens.append(p)
        # nsenter, unshare and sh all exec, so the pid is the daemon's own
        self.state["pids"][key] = {"pid": p.pid, "start": proc_start_time(p.pid) or 0}
        self._save()

    def _start_daemons(self) -> None:
        """Start slurmctld (hostname ctl) and one slurmd per namespace (hostname nodeX)."""
        conf = str(self.conf)
        self._spawn("slurmctld", ["unshare", "--uts", "sh", "-c",
                                  f'hostname {CTL_NAME} && exec slurmctld -D -i -f "$0"', conf], "slurmctld")
        for node in self.nodes:
            self._spawn(node, ["nsenter", f"--net=/run/netns/{self.netns(node)}", "unshare", "--uts", "sh", "-c",
                               f'hostname {node} && exec slurmd -D -N {node} -f "$0"', conf], f"slurmd-{node}")

        def execed() -> bool:
            # the recorded start time is the daemon's; refresh it once the exec chain finished
            for key, rec in self.state["pids"].items():
                try:
                    comm = Path(f"/proc/{rec['pid']}/comm").read_text().strip()
                except OSError:
                    raise LabError(f"{key} exited at once:\n{self.log_tails([key])}")
                if comm not in ("slurmctld", "slurmd"):
                    return False
            return True
        wait_for(execed, 10, "slurm daemons to start")

    # -- teardown -----------------------------------------------------------------------------------

    def down(self) -> None:
        """Tear everything down that this lab created; safe to call twice or after a failed bring-up."""
        with global_lock():
            self._down_locked()

    def _down_locked(self) -> None:
        t0 = time.monotonic()
        errors: List[str] = []
        st = self.state
        if not st:
            return

        def step(what: str, fn: Callable[[], Any]) -> None:
            try:
                fn()
            except Exception as exc:  # keep tearing down; report at the end
                errors.append(f"{what}: {exc}")

        pids = st.get("pids", {})

        def stop(what: str, recs: List[Dict[str, int]], grace: float = 5.0) -> None:
            # a slurmd that is retrying an RPC (e.g. "Retrying prolog complete RPC ... [sleeping 15s]")
            # does not exit on SIGTERM until that sleep ends: SIGKILL is harmless here
            t = time.monotonic()
            killed = terminate(recs, grace)
            log(f"stopped {what} in {time.monotonic() - t:.2f}s" + (f" (SIGKILLed {killed})" if killed else ""))
        # slurmds first: a slurmd whose controller is gone retries its RPCs before it exits
        step("stop slurmds", lambda: stop("slurmds", [r for k, r in pids.items() if k != "slurmctld"], 2.0))
        step("stop slurmctld", lambda: stop("slurmctld", [pids["slurmctld"]] if "slurmctld" in pids else []))
        for ns in st.get("netns", []):
            # slurmstepd, job tasks and the simulated IMEX daemons all live in the node namespaces
            step(f"kill processes in {ns}", lambda ns=ns: self._kill_netns(ns))
            step(f"delete netns {ns}", lambda ns=ns: sh(["ip", "netns", "del", ns], check=False))
        for link in reversed(st.get("links", [])):
            # a veth vanishes with its namespace, possibly just after we looked
            step(f"delete link {link}", lambda link=link: link_exists(link) and sh(
                ["ip", "link", "del", link], check=False).returncode != 0 and link_exists(link)
                and sh(["ip", "link", "del", link]))
        if st.get("hosts"):
            step("restore /etc/hosts", lambda: edit_hosts([]))
        if st.get("munged"):
            step("stop munged", lambda: terminate([st["munged"]]))
        for p in self._popens:
            p.poll()  # reap the daemons we started (zombies count as gone anyway)
        d = Path(st["dir"])
        if (d / STATE_NAME).exists() and d.resolve() != Path("/"):
            step(f"remove {d}", lambda: shutil.rmtree(d))
        if POINTER.exists():
            with contextlib.suppress(ValueError, OSError):
                if json.loads(POINTER.read_text()).get("dir") == st["dir"]:
                    POINTER.unlink()
        self.state = {}
        log(f"lab {d} down in {time.monotonic() - t0:.2f}s")
        if errors:
            raise LabError("teardown incomplete: " + "; ".join(errors))

    @staticmethod
    def _kill_netns(ns: str) -> None:
        """SIGTERM, then SIGKILL, every process inside one of the lab's namespaces."""
        recs = [proc_record(p) for p in netns_pids(ns) if proc_start_time(p) is not None]
        terminate(recs, grace=3)

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        """Return the recorded state plus daemon liveness and node states."""
        out = dict(self.state)
        out["alive"] = {k: proc_alive(r) for k, r in self.state.get("pids", {}).items()}
        if self.state.get("munged"):
            out["alive"]["munged"] = proc_alive(self.state["munged"])
        out["node_states"] = self.node_states()
        out["netns_present"] = {ns: Path(f"/run/netns/{ns}").exists() for ns in self.state.get("netns", [])}
        return out


# ---------------------------------------------------------------------------------------------------------
# command line


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``up`` / ``down`` / ``status`` command line."""
    ap = argparse.ArgumentParser(prog="slurmlab.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="bring a lab up (replacing a stale one)")
    p_up.add_argument("--nodes", type=int, default=4)
    p_up.add_argument("--dir", help="lab directory (default: a new /tmp/imxlab-XXXX); must be empty")
    p_up.add_argument("--prolog", help="Prolog script (default: this checkout's hooks/prolog)")
    p_up.add_argument("--epilog", help="Epilog script (default: this checkout's hooks/epilog)")
    for name in ("down", "status"):
        p = sub.add_parser(name, help=f"{name} the lab (default: this machine's current lab)")
        p.add_argument("--dir")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            lab = SlurmLab(args.dir, nodes=args.nodes, prolog=args.prolog, epilog=args.epilog).up()
            print(f"LAB={lab.dir}")
            print(f"export SLURM_CONF={lab.conf}")
            print(f"# imexctl: SLURMD_NODENAME=node1 {IMEXCTL_PREFIX}/bin/imexctl --config {lab.imexctl_conf} status")
            print(f"# run in a node: nsenter --net=/run/netns/{SlurmLab.netns('node1')} <cmd>")
            print(f"# tear down:     {sys.argv[0]} down --dir {lab.dir}")
        elif args.cmd == "down":
            try:
                lab = SlurmLab.attach(args.dir)
            except LabError as exc:
                log(f"{exc}; removing leftovers by name")
                with global_lock():
                    SlurmLab()._clean_stale()
                return 0
            lab.down()
        else:
            lab = SlurmLab.attach(args.dir)
            print(json.dumps(lab.status(), indent=1, sort_keys=True))
    except LabError as exc:
        print(f"slurmlab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
