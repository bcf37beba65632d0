"""The tests' fakes of the two seams, ``Host`` and ``Gpu``: they record and refuse.

They live in tests/, never in the package: the .deb and the .rpm ship no test code.

``FakeHost`` answers only ``systemctl`` (show/start/stop/reset-failed),
``nvidia-imex-ctl`` (``-q``, ``-N -j``), ``squeue`` about jobs (slurmctld's
``slurm_jobs``, tests/support/slurmjobs.py), ``scontrol version``, and ``sinfo``
with the arguments of an answer recorded from a real slurmctld
(``sinfo_answers``, tests/data/slurm/drains-<version>.json); any other
command raises ``AssertionError``.  Files stay real, under a temporary root.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from imexctl.gpu.fabric import FabricInfo
from imexctl.platform.errors import CommandError
from imexctl.platform.host import Completed, ProcInfo, TcpSocket, select_sockets
from tests.support.slurmjobs import SlurmJob, squeue

__all__ = ["JOB_GID", "FakeGpu", "FakeHost", "SlurmJob", "domain_json", "job_env"]

#: the job's primary group in :func:`job_env`: never a uid of any fixture
JOB_GID = 100


def job_env(
    *,
    job_id: int = 42,
    nodelist: str = "gb[01-02]",
    node: str = "gb01",
    uid: int = 1000,
    gid: int = JOB_GID,
    **extra: str | None,
) -> dict[str, str]:
    """The environment slurmd (23.02 to 25.11) gives a prolog, as a plain dict: the job owns its trays.

    The job's group differs from its user (``JOB_GID``), so that an owner given
    the wrong way round (``chown(path, gid, uid)``) shows in every test.
    ``SLURM_JOB_OVERSUBSCRIBE=NO`` (whole nodes), which slurmd sets from 23.02 on:
    a test of Slurm 22.05 removes it (pass ``SLURM_JOB_OVERSUBSCRIBE=None``).
    """
    env: dict[str, str | None] = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURMD_NODENAME": node,
        "SLURM_JOB_UID": str(uid),
        "SLURM_JOB_GID": str(gid),
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_JOB_OVERSUBSCRIBE": "NO",
    }
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def domain_json(
    hosts: Sequence[str],
    *,
    status: str = "UP",
    node_status: dict[int, str] | None = None,
    conn_status: str = "CONNECTED",
) -> str:
    """A ``nvidia-imex-ctl -N -j`` document in the documented shape (design.md source ctl-n-json)."""
    node_status = node_status or {}
    nodes = {}
    for i, h in enumerate(hosts):
        conns = {str(j): {"host": p, "status": conn_status, "changed": False} for j, p in enumerate(hosts) if j != i}
        nodes[str(i)] = {
            "status": node_status.get(i, "READY"),
            "host": h,
            "connections": conns,
            "changed": False,
            "version": "580.95.05",
            "hostName": "",
        }
    return json.dumps({"nodes": nodes, "timestamp": "12/2/2026 10:00:00.000", "status": status})


@dataclasses.dataclass
class FakeGpu:
    """Canned NVML fabric facts; ``error`` makes the query raise it.

    ``then``: answers for the following queries, in order (the last one repeats),
    e.g. a registration that is ``IN_PROGRESS`` first and ``COMPLETED`` later.
    """

    infos: list[FabricInfo | None] = dataclasses.field(
        default_factory=lambda: [FabricInfo(i, b"\x11" * 16, 7, 3, 0) for i in range(4)]
    )
    error: Exception | None = None
    then: list[list[FabricInfo | None]] = dataclasses.field(default_factory=list)
    calls: int = 0

    def fabric_infos(self) -> list[FabricInfo | None]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        answers = [self.infos, *self.then]
        return list(answers[min(self.calls, len(answers)) - 1])


@dataclasses.dataclass
class _Proc:
    info: ProcInfo
    alive: bool = True
    ignores_sigterm: bool = False
    unkillable: bool = False
    #: how it ended, as systemd records a main process's end: (ExecMainCode, ExecMainStatus), CLD_EXITED = 1
    #: with the exit status, CLD_KILLED = 2 with the signal; a daemon that died on its own exits 1
    ended: tuple[int, int] = (1, 1)
    #: it holds a file of the NVIDIA driver open (``driver_clients``)
    driver: bool = False
    #: it exits by itself after being seen by this many ``driver_clients`` scans (None: never)
    scans_left: int | None = None


@dataclasses.dataclass
class FakeHost:
    """A scriptable host.  The clock moves only when code sleeps."""

    addresses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    ready_after: int = 1
    q_outputs: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    domain: Callable[[list[str]], tuple[int, str]] | None = None
    hang_ctl: bool = False
    units: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    unit_exec: str = "/usr/bin/nvidia-imex -c /run/imexctl/jobs/{job}/config.cfg"
    #: the template unit's ``Environment`` as ``systemctl show`` prints it (the shipped unit's)
    unit_env: str = "KRB5_CLIENT_KTNAME=/etc/krb5.keytab"
    #: Type=simple: ``systemctl start`` returns after systemd forked the daemon; its argv is systemd's
    #: ("(nvidia-imex)") for this many process-table scans, then the exec'd daemon's
    unit_exec_scans: int = 0
    #: the exec backend's daemon, started through a wrapper that execs it: no command line (mid-exec) for
    #: this many process-table scans, then its own
    spawn_exec_scans: int = 0
    #: the exec backend's daemon comes back from spawn without a start time (0.0): a host that could not read it
    spawn_start_unknown: bool = False
    fail_verbs: set[str] = dataclasses.field(default_factory=set)
    ports_in_use: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    running_jobs: set[int] = dataclasses.field(default_factory=set)
    #: address -> what a TCP connection to it finds (``tcp_reach``); unlisted: ``open``
    reach: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the socket table (``tcp_links``): the peers connected to this tray's SERVER_PORT (None: the table is
    #: unreadable), and the peers whose SERVER_PORT this tray is connected to
    incoming: frozenset[str] | None = None
    outgoing: frozenset[str] = frozenset()
    daemon_ignores_sigterm: bool = False
    daemon_unkillable: bool = False
    daemon_dies: bool = False
    euid_value: int = 0
    #: the addresses on this host's interfaces; None: every address is local
    local_addresses: set[str] | None = None
    #: the channel nodes the product asks for are made for real under the test's root, so teardown, cleanup and
    #: status see them: as root (CI's unit layer; CAP_MKNOD), by default; as another user never (they are skipped)
    real_nodes: bool = dataclasses.field(default_factory=lambda: os.geteuid() == 0)
    calls: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    #: (argv, extra environment) of each command run with one
    envs: list[tuple[tuple[str, ...], dict[str, str]]] = dataclasses.field(default_factory=list)
    #: (argv, extra environment) of each daemon spawned detached (the exec backend)
    spawn_envs: list[tuple[tuple[str, ...], dict[str, str]]] = dataclasses.field(default_factory=list)
    #: the jobs slurmctld holds, by job id, as ``squeue`` prints them (tests/support/slurmjobs.py)
    slurm_jobs: dict[int, SlurmJob] = dataclasses.field(default_factory=dict)
    #: every ``squeue`` times out (slurmctld does not answer)
    squeue_hangs: bool = False
    #: the next this many ``squeue`` calls fail as when slurmctld cannot be reached
    squeue_down_for: int = 0
    #: every ``scontrol show node`` / ``update`` times out
    scontrol_hangs: bool = False
    #: ``sinfo`` as a real slurmctld answered it: recorded answers (``argv``, ``env``, ``rc``, ``stdout``,
    #: ``stderr``; tests/lab/answers.py --drains), each given for exactly its arguments and environment
    sinfo_answers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: every ``sinfo`` times out
    sinfo_hangs: bool = False
    #: slurmctld's nodes for ``scontrol show node NAME`` and ``scontrol update NodeName=...``: name ->
    #: ``{"state": "IDLE+DRAIN", "reason": "...", "comment": "..."}`` (absent: "Invalid node name specified")
    slurm_nodes: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    #: what ``nvidia-imex --version`` prints (imexctl doctor)
    imex_version_output: str = "IMEX version is: 580.95.05\n"
    #: what ``nvidia-ctk --version`` prints (imexctl doctor's container checks)
    ctk_version_output: str = "NVIDIA Container Toolkit CLI version 1.16.2\ncommit: 0123abc\n"
    #: the kernel's TCP table as ``tcp_sockets`` reads it, each socket with its holder; None: the test gave none,
    #: and asking is an error
    sockets: list[TcpSocket] | None = None
    #: what ``systemctl --version`` prints (Debian 13's 257, with the BPF framework SocketBindDeny= needs)
    systemd_version_output: str = "systemd 257 (257.9-1~deb13u1)\n+PAM +AUDIT +SECCOMP +BPF_FRAMEWORK +BTF +SYSVINIT\n"
    #: properties ``systemctl show`` prints once per value (``SocketBindDeny=``), by unit: name -> values
    unit_lists: dict[str, dict[str, list[str]]] = dataclasses.field(default_factory=dict)
    #: what ``scontrol version`` prints (Debian's build says slurm-wlm); 25.11: PrologTimeout is known, and
    #: DeferBatch does not imply Alloc yet
    slurm_version_output: str = "slurm-wlm 25.11.2\n"
    slept: list[float] = dataclasses.field(default_factory=list)
    signals: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    mknods: list[tuple[str, int, int, int, int, int]] = dataclasses.field(default_factory=list)
    now: float = 1000.0
    procs: dict[int, _Proc] = dataclasses.field(default_factory=dict)
    _q_probes: int = 0
    _pending_exec: dict[int, tuple[int, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    _next_pid: int = 4000

    # -- commands
    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        argv = tuple(argv)
        self.calls.append(argv)
        if env:
            self.envs.append((argv, dict(env)))
        name = Path(argv[0]).name
        if name == "scontrol":
            return self._scontrol(argv, timeout_s)
        if name == "squeue":
            return self._squeue(argv, timeout_s, env or {})
        if name == "sinfo":
            return self._sinfo(argv, timeout_s, env or {})
        if name == "systemctl":
            return self._systemctl(argv)
        if name == "nvidia-imex" and argv[1:] == ("--version",):
            return Completed(argv, 0, self.imex_version_output, "")
        if name == "nvidia-ctk" and argv[1:] == ("--version",):
            return Completed(argv, 0, self.ctk_version_output, "")
        if name == "nvidia-imex-ctl":
            if self.hang_ctl:
                self.now += timeout_s
                raise CommandError(argv, f"no answer within {timeout_s:g}s")
            return self._ctl(argv)
        raise AssertionError(f"FakeHost: unexpected command {argv}")

    def _ctl(self, argv: tuple[str, ...]) -> Completed:
        how = argv[1:3] if argv[1] == "-c" else argv[1:4] if argv[1] == "-i" else ()
        if not how or (argv[1] == "-i" and "-N" in argv):
            raise AssertionError(f"FakeHost: nvidia-imex-ctl needs -c CFG (or -i IP PORT with -q): {argv}")
        if "-q" in argv:
            self._q_probes += 1
            if self.q_outputs:
                rc, out = self.q_outputs.pop(0) if len(self.q_outputs) > 1 else self.q_outputs[0]
            else:
                rc, out = (0, "READY\n") if self._q_probes >= self.ready_after else (0, "WAITING_FOR_PEERS\n")
            return Completed(argv, rc, out, "")
        if argv[-2:] == ("-N", "-j"):
            hosts = self._nodes_of(Path(argv[2]))
            rc, out = self.domain(hosts) if self.domain else (0, domain_json(hosts))
            return Completed(argv, rc, out, "")
        raise AssertionError(f"FakeHost: unexpected nvidia-imex-ctl arguments {argv}")

    @staticmethod
    def _nodes_of(cfg: Path) -> list[str]:
        for line in cfg.read_text().splitlines():
            if line.startswith("IMEX_NODE_CONFIG_FILE="):
                return Path(line.split("=", 1)[1]).read_text().split()
        raise AssertionError(f"FakeHost: {cfg} has no IMEX_NODE_CONFIG_FILE")

    def _scontrol(self, argv: tuple[str, ...], timeout_s: float) -> Completed:
        if argv[1:] == ("version",):  # local: slurmctld is not asked
            return Completed(argv, 0, self.slurm_version_output, "")
        if argv[1:3] == ("show", "node") or argv[1] == "update":
            if self.scontrol_hangs:
                self.now += timeout_s
                raise CommandError(argv, f"no answer within {timeout_s:g}s")
            return self._scontrol_node(argv)
        raise AssertionError(
            f"FakeHost: unexpected scontrol arguments {argv} (slurmctld is asked about jobs through squeue)"
        )

    def _squeue(self, argv: tuple[str, ...], timeout_s: float, env: Mapping[str, str]) -> Completed:
        if any(not isinstance(j, SlurmJob) for j in self.slurm_jobs.values()):
            raise AssertionError("FakeHost.slurm_jobs holds SlurmJob records (tests/support/slurmjobs.py)")
        if self.squeue_hangs:
            self.now += timeout_s
            raise CommandError(argv, f"no answer within {timeout_s:g}s")
        if self.squeue_down_for > 0:
            self.squeue_down_for -= 1
            self.now += 1.0
            return Completed(
                argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
            )
        return squeue(self.slurm_jobs, argv, env)

    def _sinfo(self, argv: tuple[str, ...], timeout_s: float, env: Mapping[str, str]) -> Completed:
        """The recorded answer to exactly these arguments and this environment (``SLURM_CONF`` aside)."""
        if self.sinfo_hangs:
            self.now += timeout_s
            raise CommandError(argv, f"no answer within {timeout_s:g}s")
        asked = {k: v for k, v in env.items() if k != "SLURM_CONF"}
        for answer in self.sinfo_answers:
            if list(argv[1:]) == answer["argv"][1:] and asked == answer["env"]:
                return Completed(argv, answer["rc"], answer["stdout"], answer["stderr"])
        raise AssertionError(f"FakeHost: no recorded sinfo answer for {argv} with {dict(env)}")

    def _scontrol_node(self, argv: tuple[str, ...]) -> Completed:
        """``scontrol show node NAME`` as src/api/node_info.c prints it; ``scontrol update NodeName=N State=...``."""
        if argv[1:3] == ("show", "node") and len(argv) == 4:
            node = self.slurm_nodes.get(argv[3])
            if node is None:
                return Completed(argv, 1, "", f"Node {argv[3]} not found\n")
            return Completed(argv, 0, _show_node(argv[3], node), "")
        fields = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        if argv[1] != "update" or len(fields) != len(argv) - 2 or set(fields) - {"NodeName", "State", "Reason"}:
            raise AssertionError(f"FakeHost: unexpected scontrol arguments {argv}")
        node = self.slurm_nodes.get(fields.get("NodeName", ""))
        if node is None:
            return Completed(argv, 1, "", "slurm_update error: Invalid node name specified\n")
        words = [w for w in node["state"].split("+") if w]
        if fields.get("State") == "DRAIN":
            if not fields.get("Reason"):
                return Completed(
                    argv, 1, "", "You must specify a reason when DOWNING or DRAINING a node. Request denied\n"
                )
            node["state"] = "+".join([*(w for w in words if w != "DRAIN"), "DRAIN"])
            node["reason"] = fields["Reason"]
        elif fields.get("State") == "RESUME":
            node["state"] = "+".join(w for w in words if w != "DRAIN") or "IDLE"
            node.pop("reason", None)
        else:
            raise AssertionError(f"FakeHost: unexpected scontrol update {argv}")
        return Completed(argv, 0, "", "")

    def _systemctl(self, argv: tuple[str, ...]) -> Completed:
        verb, units = argv[1], [a for a in argv[2:] if not a.startswith("-")]
        if verb == "--version":
            return Completed(argv, 0, self.systemd_version_output, "")
        if verb in self.fail_verbs:
            return Completed(argv, 1, "", f"Job for {units[0]} failed.")
        for unit in units:
            self._settle(unit)
        if verb == "show":
            return Completed(argv, 0, "\n\n".join(self._show(u) for u in units) + "\n", "")
        if verb not in ("start", "stop", "reset-failed"):
            raise AssertionError(f"FakeHost: unexpected systemctl verb {argv}")
        unit = units[0]
        state = self.units.setdefault(unit, {"ActiveState": "inactive"})
        if verb == "start":
            job = unit.split("@", 1)[1].split(".", 1)[0]
            state.update(ActiveState="active", SubState="running", Result="success")
            proc = self._spawn(tuple(self.unit_exec.format(job=job).split()))
            if self.unit_exec_scans:
                self._pending_exec[proc.info.pid] = (self.unit_exec_scans, proc.info.cmdline)
                proc.info = proc.info._replace(cmdline=("(nvidia-imex)",), exe="/usr/lib/systemd/systemd")
            state["pid"] = str(proc.info.pid)
        elif verb == "stop" and state["ActiveState"] == "active":  # stopping a failed unit leaves it failed
            main = self.procs.get(int(state.get("pid", "0")))
            if main is not None and main.alive:
                # systemd: SIGTERM; SIGKILL once TimeoutStopSec has passed, and the unit fails (Result=timeout)
                main.alive = main.unkillable
                main.ended = (2, signal.SIGKILL) if main.ignores_sigterm else (1, 0)
            timed_out = main is not None and main.ignores_sigterm
            state.update(
                ActiveState="failed" if timed_out else "inactive", Result="timeout" if timed_out else "success"
            )
            state["SubState"] = "failed" if timed_out else "dead"
        elif verb == "reset-failed" and state["ActiveState"] == "failed":
            state.update(ActiveState="inactive", SubState="dead", Result="success")
        return Completed(argv, 0, "", "")

    def _settle(self, unit: str) -> None:
        """What systemd does when a unit's main process ends by itself: Restart=no, so the unit stays down;
        ``failed`` unless it exited 0 or on SIGTERM (systemd.service(5): SuccessExitStatus=, "clean")."""
        state = self.units.get(unit, {})
        main = self.procs.get(int(state.get("pid", "0")))
        if state.get("ActiveState") != "active" or main is None or main.alive:
            return
        code, status = main.ended
        clean = (code, status) in ((1, 0), (2, signal.SIGTERM))
        state.update(
            ActiveState="inactive" if clean else "failed",
            SubState="dead" if clean else "failed",
            Result="success" if clean else ("exit-code" if code == 1 else "signal"),
            ExecMainCode=str(code),
            ExecMainStatus=str(status),
        )

    def _show(self, unit: str) -> str:
        st = self.units.get(unit, {})
        if "@" in unit and "LoadState" not in st:
            job = unit.split("@", 1)[1].split(".", 1)[0]
            argv = self.unit_exec.format(job=job)
            exec_start = f"{{ path={argv.split()[0]} ; argv[]={argv} ; ignore_errors=no }}"
            st = {"LoadState": "loaded", "ExecStart": exec_start, "Environment": self.unit_env, **st}
        props = {
            "Id": unit,
            "LoadState": "not-found",
            "ActiveState": "inactive",
            "SubState": "dead",
            "MainPID": st.get("pid", "0"),
            "ExecStart": "",
            **{k: v for k, v in st.items() if k != "pid"},
        }
        lists = [f"{k}={v}" for k, values in self.unit_lists.get(unit, {}).items() for v in values]
        return "\n".join([*(f"{k}={v}" for k, v in props.items()), *lists])

    # -- processes
    def spawn_detached(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> ProcInfo:
        self.calls.append(("spawn", *argv))
        self.spawn_envs.append((tuple(argv), dict(env or {})))
        proc = self._spawn(tuple(argv))
        if self.spawn_start_unknown:
            return proc.info._replace(create_time=0.0)
        if self.spawn_exec_scans:
            self._pending_exec[proc.info.pid] = (self.spawn_exec_scans + 1, proc.info.cmdline)
            proc.info = proc.info._replace(cmdline=(), exe="")
        return proc.info

    def add_process(
        self,
        argv: Sequence[str],
        *,
        uid: int = 0,
        exe: str | None = None,
        driver: bool = False,
        scans_left: int | None = None,
    ) -> ProcInfo:
        """A process the product did not start (a pager, a client, another user's program): ``exe`` is argv[0]'s.

        ``driver``: it holds the NVIDIA driver open; ``scans_left``: it exits after that many ``driver_clients``.
        """
        proc = self._spawn(tuple(argv), uid=uid, exe=exe)
        proc.alive, proc.driver, proc.scans_left = True, driver, scans_left
        return proc.info

    def _spawn(self, argv: tuple[str, ...], *, uid: int = 0, exe: str | None = None) -> _Proc:
        self._next_pid += 1
        proc = _Proc(
            ProcInfo(
                self._next_pid, self.now, argv, self._next_pid, self._next_pid, uid, argv[0] if exe is None else exe
            ),
            alive=not self.daemon_dies,
            ignores_sigterm=self.daemon_ignores_sigterm,
            unkillable=self.daemon_unkillable,
        )
        self.procs[proc.info.pid] = proc
        return proc

    def processes_with_arg(
        self, arg: str, *, prefix: bool = False, uids: Collection[int] | None = None
    ) -> list[ProcInfo]:
        for pid, (scans, cmdline) in list(self._pending_exec.items()):
            if scans <= 1:
                self.procs[pid].info = self.procs[pid].info._replace(cmdline=cmdline, exe=cmdline[0])
                del self._pending_exec[pid]
            else:
                self._pending_exec[pid] = (scans - 1, cmdline)
        return [
            p.info
            for p in self.procs.values()
            if p.alive
            and (uids is None or p.info.uid in uids)
            and any(a.startswith(arg) if prefix else a == arg for a in p.info.cmdline)
        ]

    def is_alive(self, proc: ProcInfo) -> bool:
        """As the kernel's process table answers it: the same pid and start time (0: no start known, no match)."""
        p = self.procs.get(proc.pid)
        return p is not None and p.alive and p.info.create_time == proc.create_time

    def send_signal(self, proc: ProcInfo, signum: int) -> None:
        """Recorded always; delivered only to that very process (pid and start time), as RealHost does."""
        self.signals.append((proc.pid, signum))
        if not self.is_alive(proc):
            return
        p = self.procs[proc.pid]
        if signum == signal.SIGKILL:
            p.alive, p.ended = p.unkillable, (2, signal.SIGKILL)
        elif signum == signal.SIGTERM and not p.ignores_sigterm:
            p.alive, p.ended = False, (1, 0)  # the daemon's clean shutdown

    def job_is_running(self, job_id: int) -> bool:
        return job_id in self.running_jobs

    def driver_clients(self, uid: int) -> list[ProcInfo]:
        """The live processes of ``uid`` that hold the driver; each seen counts towards its ``scans_left``."""
        self.calls.append(("driver_clients", str(uid)))
        found = [p for p in self.procs.values() if p.alive and p.driver and p.info.uid == uid]
        for p in found:
            if p.scans_left is not None:
                p.scans_left -= 1
                p.alive = p.scans_left > 0
        return [p.info for p in found]

    # -- name resolution, ports, devices
    def resolve(self, name: str) -> list[str]:
        if name not in self.addresses:
            raise CommandError(("getaddrinfo", name), f"cannot resolve {name!r}: Name or service not known")
        return list(self.addresses[name])

    def port_in_use(self, address: str, port: int) -> bool:
        return (address, port) in self.ports_in_use

    def tcp_reach(self, addresses: Sequence[str], port: int, timeout_s: float) -> dict[str, str]:
        """What ``reach`` says of each address (``open`` when it says nothing); the question is recorded."""
        self.calls.append(("tcp_reach", str(port), *addresses))
        return {a: self.reach.get(a, "open") for a in addresses}

    def tcp_links(self, address: str, port: int) -> tuple[frozenset[str], frozenset[str]] | None:
        """``(incoming, outgoing)``, None when ``incoming`` is (the question is recorded)."""
        self.calls.append(("tcp_links", address, str(port)))
        return None if self.incoming is None else (self.incoming, self.outgoing)

    def tcp_sockets(self, ports: Collection[int], address: str | None = None) -> list[TcpSocket] | None:
        """The sockets of ``sockets`` on ``ports`` (bound to ``address`` or a wildcard), as RealHost selects them."""
        self.calls.append(("tcp_sockets", address or "", *map(str, sorted(ports)[:2])))
        if self.sockets is None:
            raise AssertionError("FakeHost: tcp_sockets asked, but the test gave no socket table (FakeHost.sockets)")
        return select_sockets(self.sockets, ports, address)

    def is_local_address(self, address: str) -> bool:
        return self.local_addresses is None or address in self.local_addresses

    def mknod_char(self, path: Path, major: int, minor: int, *, mode: int, uid: int, gid: int) -> None:
        """Record the device node the product asked for; with ``real_nodes`` (as root) make it, for teardown to find."""
        self.mknods.append((str(path), major, minor, mode, uid, gid))
        if self.real_nodes:
            old = os.umask(0)
            try:
                os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
                os.chown(path, uid, gid, follow_symlinks=False)
            finally:
                os.umask(old)

    # -- clock and identity
    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    def since_boot(self) -> float:
        return self.now

    def euid(self) -> int:
        return self.euid_value


def _show_node(name: str, node: dict[str, str]) -> str:
    """One node's record as ``scontrol show node`` prints it (22.05's layout: src/api/node_info.c)."""
    lines = [
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1 ",
        "   CPUAlloc=0 CPUTot=1 CPULoad=0.01",
        "   AvailableFeatures=(null)",
        "   ActiveFeatures=(null)",
        "   Gres=(null)",
        f"   NodeAddr={name} NodeHostName={name} Version=22.05.8",
        "   OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22) ",
        "   RealMemory=1 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1",
        f"   State={node['state']} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        "   Partitions=gpu ",
        "   BootTime=2026-12-02T09:00:00 SlurmdStartTime=2026-12-02T09:00:05",
        "   CfgTRES=cpu=1,mem=1M,billing=1",
        "   AllocTRES=",
        "   CapWatts=n/a",
        "   CurrentWatts=0 AveWatts=0",
        "   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s",
    ]
    if node.get("reason"):
        first, *rest = node["reason"].split("\n")
        lines.append(f"   Reason={first} [root@2026-12-02T11:14:31]")
        lines += [f"          {more}" for more in rest]
    if node.get("comment"):
        lines.append(f"   Comment={node['comment']}")
    return "\n".join(lines) + "\n\n"
