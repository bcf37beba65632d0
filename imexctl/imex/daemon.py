"""Start and stop the job's IMEX daemon: through systemd, or detached (``exec``).

Both backends run ``nvidia-imex -c <job config>`` with ``DAEMONIZE=0`` and
never leave a child in slurmd's process group or holding its pipe
(design.md source slurm-pgroup).  The daemon of a job is recognised by its argv containing the
job's config path, which no other job shares, and its program being
``[commands] nvidia_imex``, run by root (:mod:`imexctl.imex.procs`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol

from imexctl.config.paths import JobDir
from imexctl.config.settings import Settings
from imexctl.imex.peerauth import DAEMON_ENV
from imexctl.platform import Record
from imexctl.platform.errors import CommandError, DaemonError, DomainBusyError, ImexctlError, UnsafeNodeError, shorten
from imexctl.platform.fsutil import atomic_write, read_text_nofollow
from imexctl.platform.host import Host, ProcInfo

__all__ = [
    "FORGET_S",
    "Backend",
    "DaemonInfo",
    "ExecBackend",
    "SystemdBackend",
    "daemon_runs",
    "ensure_gone",
    "how_ended",
    "imex_processes",
    "job_processes",
    "make_backend",
    "parse_systemctl_show",
]


class DaemonInfo(Record):
    """What ``status`` shows about a job's daemon."""

    backend: str
    state: str
    pid: int | None
    unit: str = ""
    #: whether the daemon runs (a unit that is active, activating or reloading counts)
    running: bool = False
    #: how a daemon that is not running ended, where known (systemd): "exited with status 1",
    #: "killed by signal 9 (SIGKILL)"; '' otherwise
    ended: str = ""


class Backend(Protocol):
    """How the daemon is started and stopped."""

    def start(self, jd: JobDir) -> None:
        """Start the job's daemon with its ``config.cfg``."""

    def stop(self, jd: JobDir) -> str:
        """Stop the job's daemon; survivors are left to :func:`ensure_gone`.

        Returns:
            What the service manager had to force (e.g. a SIGKILL after the stop timeout), or "".
        """

    def info(self, jd: JobDir) -> DaemonInfo:
        """What ``status`` shows about the job's daemon."""

    def forget(self, jd: JobDir) -> str:
        """Clear what the service manager keeps of a daemon that had to be killed (a ``failed`` unit).

        Returns:
            What is still wrong afterwards, or "".
        """


def make_backend(host: Host, settings: Settings, name: str | None = None) -> Backend:
    """The backend ``name`` (default: ``[daemon] backend``)."""
    if (name or settings.daemon.backend) == "exec":
        return ExecBackend(host, settings)
    return SystemdBackend(host, settings)


def job_processes(
    host: Host, settings: Settings, config: Path, *, with_clients: bool = False, main_pid: int = 0
) -> list[ProcInfo]:
    """Live daemon processes of the job whose config is ``config``.

    A daemon is a process of root running ``[commands] nvidia_imex``
    (:mod:`imexctl.imex.procs`), or the job's unit's ``MainPID`` (``main_pid``,
    systemd backend) naming the config; any other process that names the
    config (a pager, another user's program) is none of the job's.
    ``nvidia-imex-ctl -c <config>`` names the config too: a prolog killed during
    a readiness probe leaves its ctl behind. Such a client is not the daemon
    (status, the races rule and doctor must not take it for one); with
    ``with_clients`` it is included, for the teardown that ends it as well.
    """
    return imex_processes(host, settings, str(config), with_clients=with_clients, main_pid=main_pid)


def daemon_runs(
    host: Host, settings: Settings, jd: JobDir, backend: str | None = None, *, found: list[ProcInfo] | None = None
) -> bool | None:
    """Whether the job's daemon runs: the one rule of every caller (the prolog's claim and readiness, cleanup, status).

    A daemon process of the job in ``/proc`` (``found``: what the caller's own
    scan found) says yes.  A scan that finds none proves nothing: a daemon
    whose executable changed under it (a driver branch's symlink moved) is no
    longer recognised by its program, and one started through a wrapper shows
    no command line for a moment during the exec.  Then the backend that
    started it answers (``backend``: the job's, from its ``state.json``): the
    process it recorded (exec) or its unit (systemd).

    Returns:
        True or False, or None when the backend cannot be asked (``systemctl
        show`` fails): a caller that would stop a daemon must count that as
        running.
    """
    if job_processes(host, settings, jd.config) if found is None else found:
        return True
    try:
        return make_backend(host, settings, backend).info(jd).running
    except (ImexctlError, OSError):
        return None


def imex_processes(
    host: Host, settings: Settings, arg: str, *, prefix: bool = False, with_clients: bool = False, main_pid: int = 0
) -> list[ProcInfo]:
    """IMEX daemons (and, ``with_clients``, root's ``nvidia-imex-ctl`` clients) with an argv element ``arg``.

    ``prefix``: an element that starts with ``arg`` (every job's daemon: ``<jobs_dir>/``).
    ``main_pid``: a systemd unit's main process, which counts whatever it runs.
    Only processes of root and of this process's user are read (a daemon is
    theirs), unless ``main_pid`` is given: other users' processes cost the scan
    nothing then, however long their command lines (``procscan.scan``).
    """
    from imexctl.imex import procs as imexproc

    own = host.euid()
    procs = host.processes_with_arg(arg, prefix=prefix, uids=None if main_pid else {0, own})
    if not procs:
        return []
    progs = imexproc.programs(settings.commands.nvidia_imex)
    return [
        p
        for p in procs
        if p.pid == main_pid or imexproc.is_daemon(p, progs, own) or (with_clients and p.uid in (0, own) and _is_ctl(p))
    ]


def _is_ctl(proc: ProcInfo) -> bool:
    """Whether the process is an ``nvidia-imex-ctl`` (or its simulator; argv[1] when run by an interpreter)."""
    return any("nvidia-imex-ctl" in os.path.basename(a) for a in proc.cmdline[:2])


def ensure_gone(host: Host, settings: Settings, config: Path, procs: list[ProcInfo] | None = None) -> list[int]:
    """Make sure no daemon of this job survives: SIGTERM, grace period, then SIGKILL.

    Returns:
        PIDs that needed SIGKILL.

    Raises:
        UnsafeNodeError: a process is still alive after SIGKILL.
    """
    procs = job_processes(host, settings, config, with_clients=True) if procs is None else procs
    if not procs:
        return []
    for p in procs:
        host.send_signal(p, signal.SIGTERM)
    procs = _wait_dead(host, procs, settings.daemon.kill_grace_s)
    killed = [p.pid for p in procs]
    for p in procs:
        host.send_signal(p, signal.SIGKILL)
    procs = _wait_dead(host, procs, 2.0)
    if procs:
        raise UnsafeNodeError(f"IMEX daemon pid {procs[0].pid} of {config} survives SIGKILL")
    return killed


#: pauses between checks that signalled processes are gone: from the first, doubling up to the last
_DEAD_POLL_S = (0.005, 0.05)


def _wait_dead(host: Host, procs: list[ProcInfo], timeout_s: float) -> list[ProcInfo]:
    """The processes of ``procs`` still alive after ``timeout_s``; checks often at first.

    A daemon usually exits within milliseconds of SIGTERM (the simulator's shutdown
    takes about 1 ms); a fixed 50 ms pause made every epilog wait 50 ms for it
    (docs/performance.md).  The pauses start at 5 ms and double up to 50 ms: a
    daemon slow to stop costs four more checks (each a read of ``/proc``) than before.
    """
    deadline = host.monotonic() + timeout_s
    pause, cap = _DEAD_POLL_S
    while True:
        procs = [p for p in procs if host.is_alive(p)]
        if not procs or host.monotonic() >= deadline:
            return procs
        host.sleep(pause)
        pause = min(2 * pause, cap)


class ExecBackend:
    """Spawn the daemon detached (new session, stdio to the IMEX log) and track its pid."""

    def __init__(self, host: Host, settings: Settings) -> None:
        self.host, self.settings = host, settings

    def start(self, jd: JobDir) -> None:
        """Start the daemon; the pid file records ``pid start_time`` against pid reuse."""
        argv = (self.settings.commands.nvidia_imex, "-c", str(jd.config))
        try:
            # the environment the unit we ship sets (Environment=), so both backends run the same daemon
            proc = self.host.spawn_detached(argv, log_path=self.settings.paths.imex_log_file, env=DAEMON_ENV)
        except CommandError as exc:
            raise DaemonError(f"start IMEX daemon: {exc}") from exc
        if proc.create_time <= 0:
            # never a pid without the start that proves it is this process: a later stop would signal
            # whoever has the pid by then; without a pid file the daemon is found by its command line
            return
        try:
            atomic_write(jd.pid_file, f"{proc.pid} {proc.create_time!r}\n", mode=0o600)
        except BaseException:
            # Stop it here, by the pid in hand: the roll-back would look for it by its command line, and
            # the kernel shows a new process's command line only once its exec has loaded the program,
            # a moment after spawn returns (seen under load: the roll-back found nothing, the daemon stayed)
            try:
                ensure_gone(self.host, self.settings, jd.config, [proc])
            except ImexctlError:
                pass  # the roll-back's own search reports a survivor
            raise

    def stop(self, jd: JobDir) -> str:
        """SIGTERM the recorded daemon and wait; :func:`ensure_gone` does the rest (and reports it)."""
        proc = self._recorded(jd)
        if proc is not None:
            self.host.send_signal(proc, signal.SIGTERM)
            _wait_dead(self.host, [proc], self.settings.daemon.stop_timeout_s)
        return ""

    def info(self, jd: JobDir) -> DaemonInfo:
        """Running or not, by the recorded pid (or by argv when the pid file is gone)."""
        proc = self._recorded(jd)
        alive = (
            [proc]
            if proc is not None and self.host.is_alive(proc)
            else job_processes(self.host, self.settings, jd.config)
        )
        if alive:
            return DaemonInfo("exec", "running", alive[0].pid, running=True)
        # the daemon is not imexctl's child (the hook that spawned it has exited): its exit status is lost
        return DaemonInfo("exec", "dead" if proc is not None else "absent", None)

    def forget(self, jd: JobDir) -> str:  # noqa: ARG002 (the Backend protocol's signature)
        """Nothing keeps a record of a detached daemon."""
        return ""

    def _recorded(self, jd: JobDir) -> ProcInfo | None:
        """The process ``start`` recorded; None without a pid file, or one whose start proves nothing."""
        try:
            pid_text, ctime_text = read_text_nofollow(jd.pid_file).split()
            pid, start = int(pid_text), float(ctime_text)
        except (OSError, ValueError):
            return None
        return ProcInfo(pid, start, ()) if pid > 0 and start > 0 else None


class SystemdBackend:
    """Run the daemon as instance ``<unit>@<job>.service`` of the template unit we ship."""

    def __init__(self, host: Host, settings: Settings) -> None:
        self.host, self.settings = host, settings
        self.systemctl = settings.commands.systemctl

    def unit(self, job_id: int) -> str:
        """The job's unit name, e.g. ``imexctl-imex@42.service``."""
        return f"{self.settings.daemon.unit}@{job_id}.service"

    def start(self, jd: JobDir) -> None:
        """Check the stock unit is off and our unit runs this config, then start it."""
        unit, stock = self.unit(jd.job_id), self.settings.daemon.stock_unit
        shown = self._show(unit, stock)
        if shown.get(stock, {}).get("ActiveState") in _RUNNING:
            raise DomainBusyError(
                f"{stock} is running: disable it (systemctl disable --now {stock}); imexctl runs one daemon per job"
            )
        ours = shown.get(unit, {})
        if ours.get("LoadState") != "loaded":
            raise DaemonError(f"{unit}: unit not loaded ({ours.get('LoadState', '?')}); install systemd/ units")
        exec_start = ours.get("ExecStart", "")
        want = f"{self.settings.commands.nvidia_imex} -c {jd.config} "
        if f"argv[]={want}" not in exec_start + " ":
            raise DaemonError(
                f"{unit}: ExecStart does not run '{want.strip()}' ({exec_start or 'none'}); "
                "[paths] and [commands] must match the installed unit"
            )
        self._check_environment(unit, ours.get("Environment", ""))
        self._ctl("start", unit, timeout_s=self.settings.daemon.start_timeout_s)
        self._wait_exec(unit, jd)

    def _check_environment(self, unit: str, shown: str) -> None:
        """With a GSSAPI mode, the unit must give the daemon the keytab (a drop-in may have dropped it)."""
        auth = self.settings.auth
        if auth.enabled == "no" or auth.mode == "SSL_TLS":
            return
        missing = [f"{k}={v}" for k, v in DAEMON_ENV.items() if f"{k}={v}" not in shown.split()]
        if missing:
            raise DaemonError(
                f"{unit}: Environment lacks {' '.join(missing)} ({shown or 'none'}), "
                f"which [auth] mode = {auth.mode} needs; install the shipped unit or restore it in the drop-in"
            )

    def _wait_exec(self, unit: str, jd: JobDir) -> None:
        """Wait until the daemon runs with the job's config in its argv, or its unit is no longer running.

        With ``Type=simple`` ``systemctl start`` returns as soon as systemd has forked the daemon, before
        the exec (systemd.service(5), ``Type=``): until then no process shows the config, and the
        readiness wait would take the daemon for dead.
        """
        deadline, main = self.host.monotonic() + self.settings.daemon.start_timeout_s, 0
        while not job_processes(self.host, self.settings, jd.config, main_pid=main):
            props = self._show(unit).get(unit, {})
            main = int(props.get("MainPID", "0") or 0)
            if props.get("ActiveState") not in _RUNNING:
                raise DaemonError(f"{unit} exited during start-up ({_outcome(props)})")
            if self.host.monotonic() >= deadline:
                raise DaemonError(f"{unit}: no process runs {jd.config} after systemctl start ({_outcome(props)})")
            self.host.sleep(0.02)

    def stop(self, jd: JobDir) -> str:
        """Stop the unit (systemd escalates to SIGKILL after TimeoutStopSec) and forget failures.

        ``reset-failed`` runs whatever became of the stop: a unit left ``failed``
        (a daemon that crashed, one systemd killed at the stop timeout) is what
        health agents that watch units drain a node for (design.md source
        healthagent-failed-units); stopping a failed unit leaves it failed.

        Returns:
            ``"<unit>: systemd sent SIGKILL after the stop timeout"`` when the daemon outlived SIGTERM
            by TimeoutStopSec (the unit's ``Result=timeout``), else "".
        """
        unit = self.unit(jd.job_id)
        try:
            self._ctl("stop", unit, timeout_s=self.settings.daemon.stop_timeout_s + 5)
            result = self._show(unit).get(unit, {}).get("Result", "")
        finally:
            self._reset_failed(unit)
        return f"{unit}: systemd sent SIGKILL after the stop timeout" if result == "timeout" else ""

    def forget(self, jd: JobDir) -> str:
        """After imexctl killed the unit's daemon itself: clear the ``failed`` state systemd gives the unit.

        systemd marks the unit failed once it has seen its main process die of
        SIGKILL, which may come a moment after the process is gone: until then the
        unit still shows as running or stopping, so it is asked again (bounded).

        Returns:
            ``"<unit> is still <state>"`` when it did not settle or stays failed, else "".
        """
        unit, unsettled = self.unit(jd.job_id), ("failed", "deactivating", *_RUNNING)
        deadline, state = self.host.monotonic() + FORGET_S, ""
        while True:
            self._reset_failed(unit, timeout_s=max(0.5, deadline - self.host.monotonic()))
            try:
                shown = self._show(unit, timeout_s=max(0.5, deadline - self.host.monotonic()))
            except DaemonError as exc:
                return f"{unit}: {exc}"
            state = shown.get(unit, {}).get("ActiveState", "")
            if state not in unsettled or self.host.monotonic() >= deadline:
                break
            self.host.sleep(0.1)
        return f"{unit} is still {state} after reset-failed" if state in unsettled else ""

    def _reset_failed(self, unit: str, timeout_s: float = 10) -> None:
        """``systemctl reset-failed``: never raises (a failure leaves at worst a failed unit behind)."""
        try:
            self._ctl("reset-failed", unit, timeout_s=timeout_s, check=False)
        except DaemonError:
            pass

    def info(self, jd: JobDir) -> DaemonInfo:
        """ActiveState/SubState and MainPID of the job's unit."""
        unit = self.unit(jd.job_id)
        props = self._show(unit).get(unit, {})
        pid = int(props.get("MainPID", "0") or 0) or None
        state = f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"
        running = props.get("ActiveState") in _RUNNING
        return DaemonInfo("systemd", state, pid, unit, running, "" if running else how_ended(props))

    def _show(self, *units: str, timeout_s: float = 10) -> dict[str, dict[str, str]]:
        props = "Id,LoadState,ActiveState,SubState,Result,MainPID,ExecMainCode,ExecMainStatus,ExecStart,Environment"
        done = self.host.run((self.systemctl, "show", f"--property={props}", "--", *units), timeout_s=timeout_s)
        if done.returncode != 0:
            raise DaemonError(f"systemctl show {' '.join(units)}: exit {done.returncode}: {done.stderr.strip()}")
        shown = parse_systemctl_show(done.stdout)
        # systemctl shows properties (LoadState=not-found at least) for any unit name it is given
        if units[0] not in shown:
            raise DaemonError(f"systemctl show {units[0]}: no properties of the unit in {shorten(done.stdout, 120)}")
        return shown

    def _ctl(self, verb: str, unit: str, *, timeout_s: float, check: bool = True) -> None:
        try:
            done = self.host.run((self.systemctl, verb, "--", unit), timeout_s=timeout_s)
        except CommandError as exc:
            raise DaemonError(f"systemctl {verb} {unit}: {exc}") from exc
        if check and done.returncode != 0:
            raise DaemonError(f"systemctl {verb} {unit}: exit {done.returncode}: {done.stderr.strip()[-300:]}")


_RUNNING = ("active", "activating", "reloading")
#: the most :meth:`SystemdBackend.forget` takes (its systemctl calls included, each at least 0.5 s): it waits
#: for systemd to see the end of a daemon that imexctl killed
FORGET_S = 2.0


def _outcome(props: dict[str, str]) -> str:
    """A unit's state as systemd reports it, e.g. ``failed/failed, result exit-code, status 1``."""
    state = f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"
    return f"{state}, result {props.get('Result', '?')}, status {props.get('ExecMainStatus', '?')}"


#: systemd's ExecMainCode: the si_code of the main process's end (CLD_EXITED, CLD_KILLED, CLD_DUMPED)
_EXITED, _KILLED, _DUMPED = "1", "2", "3"


def how_ended(props: dict[str, str]) -> str:
    """How a unit's main process ended, from ``ExecMainCode`` and ``ExecMainStatus``; '' when unknown.

    ``ExecMainStatus`` is the exit status after a normal exit and the signal
    number after a kill (systemd.exec(5), "ExecMainStatus").
    """
    code, status = props.get("ExecMainCode", ""), props.get("ExecMainStatus", "")
    if code == _EXITED and status.isdigit():
        return f"exited with status {status}"
    if code in (_KILLED, _DUMPED) and status.isdigit():
        try:
            name = f" ({signal.Signals(int(status)).name})"
        except ValueError:
            name = ""
        return f"{'killed' if code == _KILLED else 'dumped core'} by signal {status}{name}"
    result = props.get("Result", "")
    return f"unit result {result}" if result and result != "success" else ""


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """Parse ``systemctl show`` output for one or more units (blank-line separated, keyed by Id)."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"]] = props
    return units
