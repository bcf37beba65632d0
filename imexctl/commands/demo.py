"""``imexctl demo``: a multi-tray job on the IMEX simulator, as slurmd would run it.

Nothing on the hook path (prolog, epilog, status, cleanup) imports this module.

Each simulated tray gets its own root directory (``[paths] root``) and its own
loopback address 127.0.0.x; all trays use the same SERVER_PORT, as on a rack.
The real ``imexctl prolog`` and ``imexctl epilog`` run as separate processes,
concurrently, with the environment slurmd gives (no PATH).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from imexctl.platform.errors import ConfigError, NotPrivilegedError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["FAULTS", "HookResult", "SimRack", "Tray", "command", "run"]

# --fault NAME -> (simulator fault entries, what the demo shows); tray 2 is the victim.
FAULTS: dict[str, tuple[str, str]] = {
    "never-ready": ("@{t2} never_ready", "tray 2's daemon never gets READY: its prolog fails, all roll back"),
    "crash": ("@{t2} crash_after=0.5", "tray 2's daemon dies during start-up: its prolog fails at once"),
    "refuse-peer": ("@{t2} refuse_peer={t1}", "trays 1 and 2 never connect: the domain never comes UP"),
    "hang-ctl": ("@{t2} hang_ctl", "tray 2's nvidia-imex-ctl hangs: each probe is killed, then the deadline"),
    "cmd-blocked": (
        "@{t2} block_cmd",
        (
            "tray 2's command port is blocked for the other trays (a firewall): "
            "their nvidia-imex-ctl -N cannot reach it, the domain never looks UP, and they name it"
        ),
    ),
    "version": ("@{t2} version=570.124.06", "tray 2 reports another driver version (!V!): fails fast"),
    "map-mismatch": ("", "tray 2 resolves tray 1 to another address (!M!): the nodes files differ"),
    "port-busy": ("", "a stale process holds tray 2's SERVER_PORT: its prolog refuses to start"),
    "slow-start": ("@{t2} slow_start=2", "tray 2 starts slowly: the readiness wait absorbs it (exit 0)"),
}
_SIM_BIN = {"nvidia_imex": "nvidia-imex-sim", "nvidia_imex_ctl": "nvidia-imex-ctl-sim"}
_PKG_ROOT = str(Path(__file__).resolve().parents[2])
_PROC_DEVICES = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\nBlock devices:\n  8 sd\n"


@dataclasses.dataclass(frozen=True)
class Tray:
    """One simulated tray: its Slurm name, loopback address, root directory and imexctl config."""

    name: str
    address: str
    root: Path
    config: Path


@dataclasses.dataclass(frozen=True)
class HookResult:
    """One hook run on one tray: exit code and combined output."""

    tray: Tray
    returncode: int
    output: str


class SimRack:
    """Simulated trays under ``base``: roots, configs, hosts maps, simulator binaries.

    Used by the demo and by the end-to-end tests.
    """

    def __init__(
        self,
        base: Path,
        trays: int,
        *,
        deadline_s: float = 30,
        channels: bool | None = None,
        uid: int | None = None,
        gid: int | None = None,
        first_address: int = 11,
    ) -> None:
        self.base = base
        self.faults = base / "faults"
        self.bins = _simulator_bins(base, self.faults)
        self.channels = _can_mknod(base) if channels is None else channels
        # the job's user and its primary group: never the same number, so a channel given the wrong way
        # round (chown with uid and gid swapped) shows
        self.uid, self.gid = _demo_ids(uid, gid)
        self.trays = [
            Tray(f"tray{i:02d}", f"127.0.0.{first_address - 1 + i}", base / f"tray{i:02d}", base / f"tray{i:02d}.conf")
            for i in range(1, trays + 1)
        ]
        self.set_faults("")
        hosts = "".join(f"{t.address} {t.name}\n" for t in self.trays)
        for t in self.trays:
            (t.root / "proc").mkdir(parents=True)
            (t.root / "proc/devices").write_text(_PROC_DEVICES)
            (t.root / "etc/imexctl").mkdir(parents=True)
            self.hosts_file(t).write_text(hosts)
            self._write_config(t, deadline_s)

    def hosts_file(self, t: Tray) -> Path:
        """The tray's static name -> address map."""
        return t.root / "etc/imexctl/hosts"

    def set_faults(self, text: str) -> None:
        """Replace the simulator fault file (read by each daemon when it starts)."""
        self.faults.write_text(text + "\n")

    def _write_config(self, t: Tray, deadline_s: float) -> None:
        t.config.write_text(
            f"[paths]\nroot = {t.root}\n"
            f"[commands]\nnvidia_imex = {self.bins['nvidia_imex']}\nnvidia_imex_ctl = {self.bins['nvidia_imex_ctl']}\n"
            "[daemon]\nbackend = exec\nkill_grace_s = 2\n"
            f"[policy]\nfabric = none\nchannels = {'job' if self.channels else 'none'}\n"
            "[resolve]\nmethod = hosts_file\n"
            f"[readiness]\ndeadline_s = {deadline_s}\n"
        )
        t.config.chmod(0o644)

    def nodelist(self, trays: list[Tray] | None = None) -> str:
        """The job's SLURM_JOB_NODELIST, folded like Slurm does."""
        from imexctl.slurm import nodefold

        return nodefold.fold([t.name for t in trays or self.trays])

    def job_env(self, t: Tray, job_id: int, hook: str, trays: list[Tray] | None = None) -> dict[str, str]:
        """What slurmd gives a Prolog/Epilog: no PATH, both node-list variables (design.md source slurm-env)."""
        from imexctl import slurm

        env = slurm.hook_env(
            hook,
            job_id,
            t.name,
            self.nodelist(trays),
            self.uid,
            self.gid,
            user="demo",
            partition="nvl72",
            cluster="demo",
        )
        return {**env, "IMEXCTL_CONFIG": str(t.config), "PYTHONPATH": _PKG_ROOT}

    def run_hooks(self, hook: str, job_id: int, trays: list[Tray] | None = None) -> list[HookResult]:
        """Run ``imexctl <hook>`` for every tray of the job at once, like slurmd on each node."""
        trays = trays or self.trays
        procs = [
            (
                t,
                subprocess.Popen(
                    [sys.executable, "-m", "imexctl", hook],
                    env=self.job_env(t, job_id, hook, trays),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                ),
            )
            for t in trays
        ]
        # communicate() before the exit code: a hook that prints more than a pipe buffer must not block
        outputs = [(t, p.communicate()[0].decode(errors="replace"), p) for t, p in procs]
        return [HookResult(t, p.returncode, out) for t, out, p in outputs]

    def imexctl(self, t: Tray, *args: str) -> subprocess.CompletedProcess[str]:
        """Run an admin command (status, cleanup) on one tray."""
        from imexctl.slurm import NODENAME

        env = {NODENAME: t.name, "IMEXCTL_CONFIG": str(t.config), "PYTHONPATH": _PKG_ROOT}
        return subprocess.run(
            [sys.executable, "-m", "imexctl", *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )

    def ctl(self, t: Tray, job_id: int, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the simulated nvidia-imex-ctl against the tray's config of ``job_id``."""
        cfg = t.root / f"run/imexctl/jobs/{job_id}/config.cfg"
        return subprocess.run(
            [self.bins["nvidia_imex_ctl"], "-c", str(cfg), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def kill_all(self) -> list[int]:
        """Safety net for interrupted runs: end every process started under the rack."""
        import psutil

        procs = [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(str(self.base) in a for a in p.info.get("cmdline") or []) and p.pid != os.getpid()
        ]
        for p in procs:
            p.kill()
        psutil.wait_procs(procs, timeout=5)
        return [p.pid for p in procs]

    def leftovers(self) -> list[str]:
        """Job directories, channel nodes and processes left under the rack's directory."""
        import psutil

        left = [str(p) for t in self.trays for p in (t.root / "run/imexctl/jobs").glob("*")]
        left += [str(p) for t in self.trays for p in (t.root / "dev/nvidia-caps-imex-channels").glob("*")]
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            cmd = p.info.get("cmdline") or []
            if any(str(self.base) in a for a in cmd) and p.info.get("status") != psutil.STATUS_ZOMBIE:
                left.append(f"process {p.pid}: {' '.join(cmd)}")
        return left


def run(*, trays: int = 4, fault: str | None = None, keep: bool = False) -> int:
    """Run the demo; returns the exit code (0: job ran and nothing was left behind)."""
    if os.geteuid() != 0:
        raise NotPrivilegedError("the demo runs the real prolog and epilog, which need root")
    if not 1 <= trays <= 64:
        raise ConfigError("--trays must be between 1 and 64")
    if fault is not None and (fault not in FAULTS or trays < 2):
        raise ConfigError(f"--fault must be one of {', '.join(FAULTS)} and needs --trays >= 2")
    base = Path(tempfile.mkdtemp(prefix="imexdemo-", dir="/tmp"))
    rack = None
    try:
        rack = SimRack(base, trays, deadline_s=8 if fault else 30)
        return _run(rack, fault)
    finally:
        if rack is not None and not keep:
            rack.kill_all()
        if keep:
            print(f"\nkept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _run(rack: SimRack, fault: str | None) -> int:
    job_id = 1000 + os.getpid() % 50000
    t1, t2 = rack.trays[0], rack.trays[min(1, len(rack.trays) - 1)]
    _say(
        f"imexctl demo: job {job_id} on {len(rack.trays)} simulated trays {rack.nodelist()} "
        f"(127.0.0.11 and up), user uid {rack.uid} gid {rack.gid}"
    )
    if fault:
        _say(f"fault '{fault}': {FAULTS[fault][1]}")
        rack.set_faults(FAULTS[fault][0].format(t1=t1.address, t2=t2.address))
        if fault == "map-mismatch":
            hosts = rack.hosts_file(t2)
            hosts.write_text(hosts.read_text().replace(f"{t1.address} ", "127.0.0.250 ", 1))
    if not rack.channels:
        _say("note: this machine cannot create device nodes (no CAP_MKNOD); channels are skipped")
    blocker = _occupy_port(t2, job_id) if fault == "port-busy" else None
    try:
        ok = _hook_round(rack, "prolog", job_id)
        if ok:
            _show_domain(rack, t1, job_id)
            ok = _check_channels(rack)
        _hook_round(rack, "epilog", job_id)
    finally:
        if blocker is not None:
            blocker.close()
    left = rack.leftovers()
    _say("\nafter the epilogs: " + ("nothing left (no daemon, no file, no channel)" if not left else "LEFT BEHIND:"))
    for item in left:
        _say(f"  {item}")
    if left:
        return 70
    return 0 if ok else 1


def _simulator_bins(base: Path, faults: Path) -> dict[str, str]:
    """Launchers for the simulated daemon and ctl, written for this interpreter.

    The daemon's launcher sets ``IMEX_SIM_FAULTS_FILE`` in its own environment:
    faults reach the simulator that way only, never through the config that
    imexctl writes.
    """
    out = {}
    for key, name in _SIM_BIN.items():
        module = "imexctl.sim.daemon" if key == "nvidia_imex" else "imexctl.sim.ctl"
        env = f"os.environ['IMEX_SIM_FAULTS_FILE'] = {str(faults)!r}\n" if key == "nvidia_imex" else ""
        path = base / "bin" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            f"#!{sys.executable}\nimport os, sys\n{env}sys.path.insert(0, {_PKG_ROOT!r})\n"
            f"from {module} import main\nsys.exit(main())\n"
        )
        path.chmod(0o755)
        out[key] = str(path)
    return out


def _can_mknod(base: Path) -> bool:
    import stat

    probe = base / ".mknod-probe"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


#: the demo job's group when the caller names none: ``users`` on Debian and Red Hat alike
_DEMO_GID = 100


def _demo_ids(uid: int | None, gid: int | None) -> tuple[int, int]:
    """The demo job's ``(uid, gid)``: ``nobody`` (root without it) and group 100, unless given.

    Raises:
        ConfigError: the two are the same number (a swapped owner would not show).
    """
    if uid is None:
        import pwd

        try:
            uid = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            uid = 0
    gid = _DEMO_GID if gid is None else gid
    if gid == uid:
        raise ConfigError(f"the demo job's uid and gid must differ (both {uid})")
    return uid, gid


def _hook_round(rack: SimRack, hook: str, job_id: int) -> bool:
    _say(f"\n== {hook}: {len(rack.trays)} trays in parallel, as slurmd runs them")
    t0 = time.monotonic()
    results = rack.run_hooks(hook, job_id)
    for r in results:
        reason = _reason(r.output) if r.returncode else ""
        _say(f"  {r.tray.name} ({r.tray.address}): exit {r.returncode}{'  ' + reason if reason else ''}")
    _say(f"  all {hook}s done in {time.monotonic() - t0:.2f}s")
    return all(r.returncode == 0 for r in results)


def _reason(output: str) -> str:
    import json

    for line in reversed(output.strip().splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("reason"):
            return str(rec["reason"])
    return output.strip().splitlines()[-1] if output.strip() else ""


def _show_domain(rack: SimRack, t: Tray, job_id: int) -> None:
    _say(f"\n== the job's domain, as {t.name} sees it: nvidia-imex-ctl -N")
    _say(rack.ctl(t, job_id, "-N").stdout.rstrip())
    _say(f"\n== imexctl status on {t.name}  (no slurmstepd here: a set-up domain, no epilog yet, counts as running)")
    done = rack.imexctl(t, "status")
    _say((done.stdout + done.stderr).rstrip())


def _check_channels(rack: SimRack) -> bool:
    """Each tray holds one channel node, the job's user's and group's with mode 0600; say which does not."""
    import stat

    if not rack.channels:
        return True
    want = (rack.uid, rack.gid, 0o600)
    _say(f"\n== the job's channel on each tray: owner uid {rack.uid}, group gid {rack.gid}, mode 0600")
    ok = True
    for t in rack.trays:
        found = sorted((t.root / "dev/nvidia-caps-imex-channels").glob("channel*"))
        got = [(os.lstat(p), p.name) for p in found]
        owners = [(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) for st, _ in got]
        right = len(got) == 1 and stat.S_ISCHR(got[0][0].st_mode) and owners == [want]
        ok = ok and right
        shown = ", ".join(f"{name} uid {u} gid {g} mode {m:04o}" for (_, name), (u, g, m) in zip(got, owners))
        _say(f"  {t.name}: {shown or 'no channel'}{'' if right else '  WRONG'}")
    return ok


def _occupy_port(t: Tray, job_id: int) -> socket.socket:

    from imexctl.imex.config import job_port

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((t.address, job_port(job_id, (61000, 61999))))
    s.listen(1)
    return s


def _say(text: str) -> None:
    print(text, flush=True)


def command(args: argparse.Namespace, _env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl demo --trays N [--fault NAME] [--keep]``."""
    return int(run(trays=args.trays, fault=args.fault, keep=args.keep))
