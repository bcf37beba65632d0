"""SystemdLab: a Slurm cluster of booted containers, systemd as PID 1 on every node, imexctl as a site installs it.

``ctl`` runs Debian's ``slurmctld.service``; ``node1``..``nodeN`` run Debian's ``munge.service`` and
``slurmd.service`` with the lab's slurm.conf in ``/etc/slurm``, imexctl installed by the commands of
docs/install.md (siteinstall.py), ``[daemon] backend = systemd`` (the default), the simulator behind
``/usr/bin/nvidia-imex`` and a stand-in ``nvidia-imex.service``. Every machine is a :class:`Container`
(nspawn.py) on an overlay of the one cached Debian 13 root (debroot.py), in a network namespace of its own on
the lab's bridge (``<subnet>.10`` for ctl, ``<subnet>.(10+i)`` for node i). Slurm's client commands run
inside ``ctl``. One directory, ``<top>/share``, is bind-mounted at the same path into every machine: job
output, the step checker, and ``nodes/<node>`` links to ``/`` (so tests/lab/jobs.py's helpers and its step
checker work unchanged).

Recorded (``<top>/lab.json`` and ``/run/<prefix>.json``): each container's nspawn and init pids with their
start times, its cgroups and overlay, the namespaces and links. ``down`` removes exactly that; ``up`` first
removes a stale lab of the same names whose owner is gone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from imexctl.platform.fsutil import atomic_write
from tests.lab import debroot, siteinstall
from tests.lab.cluster import (
    LabBusy,
    LabUnavailable,
    SlurmLab,
    _flock,
    build_network,
    delete_link,
    kill_netns,
    link_exists,
    log,
    netns_problems,
    slurm_conf,
)
from tests.lab.nspawn import Container, cgroup_parents, nspawn_problems, remove_cgroup
from tests.lab.procs import LabError, proc_start_time, sh, unmount_all
from tests.lab.versions import LabNames

__all__ = ["NAMES", "SystemdLab"]

NAMES = LabNames(prefix="imxsd", bridge="imxsdbr0", subnet="198.18.2", ctl_port=6817, first_job_id=300000)
CTL = "ctl"
STATE_NAME = "lab.json"
TOP = Path("/var/tmp")  # not /tmp: the machines mount a tmpfs there, which would hide the shared directory
#: the stand-in NVIDIA package: the simulator's fault switches and the driver's /proc/devices
FAULTS = "/etc/imexlab/faults"
DEVICES = "/etc/imexlab/devices"
UNIT_DIR = "/usr/lib/systemd/system"
SLURM_FILES = {
    "StateSaveLocation": "/var/lib/slurm/slurmctld",
    "SlurmctldPidFile": "/run/slurmctld/slurmctld.pid",
    "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
    "SlurmdSpoolDir": "/var/lib/slurm/slurmd",
    "SlurmdPidFile": "/run/slurm/slurmd.pid",
    "SlurmdLogFile": "/var/log/slurm/slurmd.log",
}
IMEXCTL_CONF = """\
# the lab's site configuration (tests/lab/sysd.py); every other key keeps its default ([daemon] backend = systemd)
[paths]
# the stand-in driver's /proc/devices: the machine's own has no nvidia-caps-imex-channels line
proc_devices = /etc/imexlab/devices
[policy]
# no NVML in the machines
fabric = none
"""
STOCK_UNIT = """\
# lab stand-in for the nvidia-imex package's unit (tests/lab/sysd.py): one domain-wide daemon, enabled
[Unit]
Description=NVIDIA IMEX service (lab stand-in)
After=network-online.target

[Service]
ExecStart=/usr/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
LAUNCHER = """\
#!/bin/sh
# lab stand-in for {real} (tests/lab/sysd.py): the simulator, with the lab's fault switches
{announce}IMEX_SIM_FAULTS_FILE={faults} exec /opt/imexctl/bin/{sim} "$@"
"""
#: the daemon's stand-in says one line on stderr, so a test sees where the daemon's output goes
ANNOUNCE = 'echo "lab stand-in /usr/bin/nvidia-imex: exec nvidia-imex-sim $*" >&2\n'
PROC_DEVICES = (
    "Character devices:\n  1 mem\n  4 tty\n195 nvidia\n234 nvidia-caps-imex-channels\n"
    "235 nvidia-caps\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
)


def _parallel(fn: Callable[[Container], Any], machines: Sequence[Container]) -> list[Any]:
    """Run ``fn`` on every machine at once; re-raise the first failure after all have finished."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(machines))) as pool:
        futures = [pool.submit(fn, m) for m in machines]
        concurrent.futures.wait(futures)
    return [f.result() for f in futures]


class SystemdLab:
    """``nodes`` booted compute nodes and a booted controller; see the module docstring."""

    def __init__(
        self,
        root: Path,
        nodes: int = 2,
        workdir: os.PathLike[str] | None = None,
        owner_pid: int | None = None,
        repo: Path = debroot.REPO,
        names: LabNames = NAMES,
        site_install: bool = True,
        capabilities: Sequence[str] = (),
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError("nodes must be 1..9")
        if workdir and (Path(workdir).resolve() == Path("/tmp") or Path("/tmp") in Path(workdir).resolve().parents):
            raise ValueError(f"{workdir}: the machines mount a tmpfs on /tmp, which would hide it; use /var/tmp")
        self.root, self.repo, self.names = Path(root), Path(repo), names
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self._top = Path(workdir) if workdir else None
        self.owner_pid = owner_pid
        #: False: the nodes boot without imexctl (the Ansible role installs it, tests/ansible)
        self.site_install = site_install
        #: the nodes' capabilities beyond nspawn's default set (the role's test: CAP_NET_ADMIN for nft)
        self.capabilities = tuple(capabilities)
        self.state: dict[str, Any] = {}
        self.machines: dict[str, Container] = {}

    # -- names and paths ----------------------------------------------------------------------------

    @property
    def top(self) -> Path:
        """The lab's directory: machines' disks, the shared directory, lab.json."""
        if self._top is None:
            raise LabError("the lab has no directory yet")
        return self._top

    @property
    def dir(self) -> Path:
        """The directory every machine sees at the same path (job output, the step checker)."""
        return self.top / "share"

    def index(self, name: str) -> int:
        """0 for ctl, i for node i."""
        return 0 if name == CTL else int(name[4:])

    def addr(self, name: str) -> str:
        """A machine's IPv4 address."""
        return f"{self.names.subnet}.{10 + self.index(name)}"

    def netns(self, name: str) -> str:
        """A machine's network namespace."""
        return f"{self.names.prefix}-{name}"

    def node(self, name: str) -> Container:
        """The machine called ``name`` (ctl or a node)."""
        return self.machines[name]

    def node_root(self, node: str) -> Path:
        """A running node's whole file system as the host reads it (its /run and /dev included)."""
        return self.node(node).view

    def slurmd_log(self, node: str) -> Path:
        """A node's slurmd log file."""
        return self.node_root(node) / SLURM_FILES["SlurmdLogFile"].lstrip("/")

    @property
    def slurmctld_log(self) -> Path:
        """The controller's slurmctld log file (what jobs.diagnose reads on a failure)."""
        return self.node_root(CTL) / SLURM_FILES["SlurmctldLogFile"].lstrip("/")

    @staticmethod
    def unit(job: int) -> str:
        """The job's IMEX unit."""
        return f"imexctl-imex@{job}.service"

    # -- commands -----------------------------------------------------------------------------------

    def _ids(self, uid: int) -> tuple[int, int]:
        """(uid, gid) of a user of the root (from its /etc/passwd)."""
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[2] == str(uid):
                return uid, int(fields[3])
        raise LabError(f"uid {uid} is not in {self.root}/etc/passwd")

    def run(
        self,
        argv: Sequence[str],
        check: bool = True,
        timeout: float = 60,
        user: int | None = None,
        cwd: os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Any:
        """Run a Slurm client command on ctl, optionally as another uid (and its primary gid)."""
        ids = self._ids(user) if user is not None else None
        return self.node(CTL).exec(
            argv, user=ids, cwd=str(cwd or self.dir / "out"), env=env, check=check, timeout=timeout
        )

    def imexctl(self, node: str, *args: str, check: bool = False, timeout: float = 120) -> Any:
        """Run the installed imexctl on a node as root, as an administrator would."""
        return self.node(node).exec(["/opt/imexctl/bin/imexctl", *args], check=check, timeout=timeout)

    def set_faults(self, node: str, text: str) -> None:
        """Set the simulator's fault switches on a node (read by each daemon when it starts)."""
        (self.node(node).merged / FAULTS.lstrip("/")).write_text(text)

    # reused as they are: they only need run(), nodes and check_daemons()
    job = SlurmLab.job
    node_states = SlurmLab.node_states
    wait_idle = SlurmLab.wait_idle

    def check_daemons(self) -> None:
        """Raise with the console's end if a machine has stopped."""
        dead = [m for m in self.machines.values() if not m.running()]
        if dead:
            raise LabError("machines stopped: " + "; ".join(f"{m.name}: {m.console_tail(10)}" for m in dead))

    # -- state --------------------------------------------------------------------------------------

    def _save(self) -> None:
        self.state["machines"] = {n: m.to_state() for n, m in self.machines.items()}
        text = json.dumps(self.state, indent=1, sort_keys=True) + "\n"
        if self._top and self._top.is_dir():
            atomic_write(self._top / STATE_NAME, text)
        atomic_write(self.names.pointer, text)

    @classmethod
    def attach(cls, state: Mapping[str, Any], names: LabNames = NAMES) -> SystemdLab:
        """A lab object for a recorded lab (to tear it down from another process)."""
        lab = cls(Path(state["root"]), len(state["nodes"]), state["top"], names=names)
        lab.state = dict(state)
        lab.machines = {n: Container.from_state(m) for n, m in state.get("machines", {}).items()}
        return lab

    # -- bring-up -----------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Return why this machine cannot run the lab (empty when it can)."""
        return nspawn_problems() or netns_problems(self.names)

    def up(self, timeout: float = 300) -> SystemdLab:
        """Bring the lab up (removing a stale one first) and wait until every node is idle."""
        problems = self.problems()
        if problems:
            raise LabUnavailable("; ".join(problems))
        t0 = time.monotonic()
        with _flock(self.names.lock):
            self._clean_stale()
            if self._top is None:
                self._top = Path(tempfile.mkdtemp(prefix=f"{self.names.prefix}-", dir=TOP))
            elif self._top.exists() and any(self._top.iterdir()):
                raise LabError(f"{self._top} is not empty")
            self._top.mkdir(parents=True, exist_ok=True)
            self.state = {
                "top": str(self.top),
                "root": str(self.root),
                "nodes": self.nodes,
                "owner_pid": self.owner_pid,
                "owner_start": proc_start_time(self.owner_pid) if self.owner_pid else None,
                "netns": [],
                "links": [],
                "timings": {},
            }
            self._save()
            try:
                self._bring_up(t0, timeout)
            except BaseException:
                log("bring-up failed, tearing down")
                self._down_locked()
                raise
        self.state["timings"]["up"] = round(time.monotonic() - t0, 2)
        self._save()
        log(f"systemd lab up in {self.state['timings']}: {self.top}")
        return self

    def _mark(self, what: str, since: float) -> float:
        now = time.monotonic()
        self.state["timings"][what] = round(now - since, 2)
        self._save()
        return now

    def _bring_up(self, t0: float, timeout: float) -> None:
        info = json.loads((self.root.parent / debroot.INFO).read_text())
        wheels = debroot.ensure_wheelhouse(debroot.DebRoot(self.root, info), self.repo, log)
        self._write_share()
        names = [CTL, *self.nodes]
        members = [(self.netns(n), f"{self.names.prefix}-v{self.index(n)}", self.addr(n)) for n in names]
        build_network(self.names.bridge, f"{self.names.subnet}.1", members, self.state, self._save)
        for n in names:
            binds = [(str(self.dir), str(self.dir), False)]
            if n != CTL:
                binds.append((str(wheels), siteinstall.WHEELS, True))
            caps = self.capabilities if n != CTL else ()
            m = Container(
                n, f"{self.names.prefix}-{n}", self.top / "machines" / n, self.root, self.netns(n), binds, caps
            )
            self.machines[n] = m
            self._save()
            m.mount()
            self._provision(m)
        t = self._mark("prepare", t0)
        self._boot([self.node(CTL)])
        t = self._mark("boot_ctl", t)
        self._boot([self.node(n) for n in self.nodes])
        t = self._mark("boot_nodes", t)
        if self.site_install:
            _parallel(lambda m: (siteinstall.install_imexctl(m), siteinstall.configure_node(m)), self._nodes())
        t = self._mark("install", t)
        self.wait_idle(timeout=max(10.0, timeout - (time.monotonic() - t0)))
        self._mark("idle", t)

    def _nodes(self) -> list[Container]:
        return [self.node(n) for n in self.nodes]

    def _boot(self, machines: Sequence[Container]) -> None:
        for m in machines:
            m.start(self._save)
        states = _parallel(lambda m: m.wait_booted(), machines)
        for m, st in zip(machines, states):
            if st != "running":
                failed = m.exec(["systemctl", "--failed", "--plain", "--no-legend"], check=False).stdout
                log(f"{m.name} booted {st}: {failed.strip()}")

    def _write_share(self) -> None:
        """The shared directory: job output (any user), the step checker's nodes/<node> links to /."""
        share = self.dir
        for sub in ("out", "bin", "nodes"):
            (share / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.top, 0o755)
        os.chmod(share, 0o755)
        os.chmod(share / "out", 0o1777)
        for n in self.nodes:
            (share / "nodes" / n).symlink_to("/")

    def _provision(self, m: Container) -> None:
        """What the machine has before its first boot: names, slurm.conf, its role; on nodes the NVIDIA side."""
        etc = m.merged / "etc"
        (etc / "hostname").write_text(f"{m.name}\n")  # systemd sets the host name from it at boot
        lines = [f"{self.addr(n)} {n}" for n in [CTL, *self.nodes]]
        local = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        (etc / "hosts").write_text(local + "".join(f"{ln}\n" for ln in lines))
        (etc / "slurm" / "slurm.conf").write_text(self.slurm_conf())
        (etc / "slurm" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")  # no cgroup v2-only tree here
        # the controller runs no slurmd, the nodes no slurmctld
        other = "slurmd.service" if m.name == CTL else "slurmctld.service"
        (etc / "systemd" / "system" / other).symlink_to("/dev/null")
        if m.name != CTL:
            self._stand_in_nvidia(m)
            self._site_files(m)

    def slurm_conf(self) -> str:
        """The cluster's slurm.conf: Debian's paths, and docs/install.md's lines (siteinstall.SLURM_CONF)."""
        text = slurm_conf(
            cluster=self.names.prefix,
            ctl=(CTL, self.addr(CTL)),
            ctl_port=self.names.ctl_port,
            slurm_user="slurm",
            files=SLURM_FILES,
            slurmd_debug="debug2",
            prolog="/etc/slurm/prolog.d/*",
            epilog="/etc/slurm/epilog.d/*",
            prolog_epilog_timeout=120,
            nodes=[(n, self.addr(n)) for n in self.nodes],
            first_job_id=self.names.first_job_id,
        )
        missing = [ln for ln in siteinstall.SLURM_CONF if ln not in text.splitlines()]
        if missing:
            raise LabError(f"the lab's slurm.conf lacks docs/install.md's lines {missing}")
        return text

    def _stand_in_nvidia(self, m: Container) -> None:
        """The nvidia-imex package as the lab fakes it: binaries running the simulator, an enabled stock unit."""
        root = m.merged
        for real, sim in (("nvidia-imex", "nvidia-imex-sim"), ("nvidia-imex-ctl", "nvidia-imex-ctl-sim")):
            path = root / "usr" / "bin" / real
            announce = ANNOUNCE if real == "nvidia-imex" else ""
            path.write_text(LAUNCHER.format(real=f"/usr/bin/{real}", sim=sim, faults=FAULTS, announce=announce))
            path.chmod(0o755)
        (root / FAULTS.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / FAULTS.lstrip("/")).write_text("")
        (root / DEVICES.lstrip("/")).write_text(PROC_DEVICES)
        (root / UNIT_DIR.lstrip("/") / "nvidia-imex.service").write_text(STOCK_UNIT)
        wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "nvidia-imex.service").symlink_to(f"{UNIT_DIR}/nvidia-imex.service")

    def _site_files(self, m: Container) -> None:
        """The site's copy of the checkout and its imexctl.conf; no imexctl installed yet."""
        src = m.merged / siteinstall.CHECKOUT.lstrip("/")
        debroot.copy_source(self.repo, src)
        for sub in ("hooks", "systemd"):
            shutil.copytree(self.repo / sub, src / sub)
        (src / "imexctl.conf").write_text(IMEXCTL_CONF)
        # the root's own venv (debroot.py's, for the chroot lab) goes: the page's install starts from nothing
        venv = m.merged / debroot.VENV.lstrip("/")
        if venv.exists():
            shutil.rmtree(venv)

    # -- the life of a node -------------------------------------------------------------------------

    def reboot(self, node: str, clean: bool = False, timeout: float = 120) -> dict[str, float]:
        """Stop a node (``clean=False``: pull the plug) and boot it again; return how long each part took."""
        m, t0 = self.node(node), time.monotonic()
        m.stop(clean=clean)
        t1 = time.monotonic()
        m.start(self._save)
        m.wait_booted(timeout)
        return {"stop": round(t1 - t0, 2), "boot": round(time.monotonic() - t1, 2)}

    # -- teardown -----------------------------------------------------------------------------------

    def down(self) -> None:
        """Tear everything down that this lab created; safe to call twice or after a failed bring-up."""
        with _flock(self.names.lock):
            self._down_locked()

    def _down_locked(self) -> None:
        t0, st, errors = time.monotonic(), self.state, []
        if not st:
            return

        def step(what: str, fn: Callable[[], Any]) -> None:
            try:
                fn()
            except Exception as exc:  # keep tearing down; report at the end
                errors.append(f"{what}: {exc}")

        machines = list(self.machines.values())
        step("stop the machines", lambda: _parallel(lambda m: m.stop(clean=True, timeout=20), machines))
        for m in machines:
            step(f"unmount {m.name}", m.unmount)
        for ns in st.get("netns", []):
            step(f"kill processes in {ns}", functools.partial(kill_netns, ns))
            step(f"delete netns {ns}", functools.partial(sh, ["ip", "netns", "del", ns], check=False))
        for link in reversed(st.get("links", [])):
            step(f"delete link {link}", functools.partial(delete_link, link))
        top = Path(st["top"])
        if self._leftover_mounts(top):
            errors.append(f"not removing {top}: mounts left under it")
        elif (top / STATE_NAME).exists():
            step(f"remove {top}", lambda: shutil.rmtree(top))
        with contextlib.suppress(ValueError, OSError):
            if json.loads(self.names.pointer.read_text()).get("top") == st["top"]:
                self.names.pointer.unlink()
        self.state = {}
        log(f"systemd lab {top} down in {time.monotonic() - t0:.2f}s")
        if errors:
            raise LabError("teardown incomplete: " + "; ".join(errors))

    @staticmethod
    def _leftover_mounts(top: Path) -> bool:
        text = Path("/proc/self/mountinfo").read_text()
        return any(line.split()[4].startswith(f"{top}/") for line in text.splitlines())

    def remove_stale(self) -> None:
        """Remove a lab of these names whose owner is gone, and leftovers by name (``down`` without a lab)."""
        with _flock(self.names.lock):
            self._clean_stale()

    def _clean_stale(self) -> None:
        """Tear down a recorded lab of our names whose owner is gone, then leftovers by name; refuse if it lives."""
        pointer = self.names.pointer
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(pointer.read_text())
            owner = state.get("owner_pid")
            if owner and owner != os.getpid() and proc_start_time(owner) == state.get("owner_start"):
                raise LabBusy(f"a systemd lab in {state['top']} is owned by live process {owner}")
            log(f"removing previous systemd lab {state['top']}")
            SystemdLab.attach(state, self.names)._down_locked()
        prefix = self.names.prefix
        for parent in cgroup_parents():
            for cg in parent.glob(f"{prefix}-*"):
                remove_cgroup(cg)  # a container whose record was lost: killing its init stops it
        for top in sorted(TOP.glob(f"{prefix}-*/machines/*")):
            unmount_all(top)
        for name in sh(["ip", "netns", "list"], check=False).stdout.split():
            if name.startswith(f"{prefix}-"):
                kill_netns(name)
                sh(["ip", "netns", "del", name], check=False)
        for link in sorted(os.listdir("/sys/class/net")):
            if (link.startswith(f"{prefix}-v") or link == self.names.bridge) and link_exists(link):
                delete_link(link)
