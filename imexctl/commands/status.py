"""``imexctl status``: what this node's IMEX domain looks like, for an admin.

:func:`collect` answers with a :class:`Status` record; the text, ``--json``
(its :meth:`Status.data` in the result envelope) and the live gauges
(:mod:`imexctl.commands.live`) all read that record.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from imexctl.channels import devices
from imexctl.hooks.jobs import known_jobs, still_runs
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import JobState, read_state
from imexctl.imex import daemon
from imexctl.imex.ctl import DomainStatus
from imexctl.platform import Record
from imexctl.platform.errors import CommandError, ImexctlError
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.platform.output import print_json

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from imexctl.commands.live import Live
    from imexctl.config.paths import JobDir
    from imexctl.gpu.fabric import Gpu
    from imexctl.hooks.metrics import Domain
    from imexctl.imex.daemon import DaemonInfo
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject
    from imexctl.platform.versions import Pending

__all__ = [
    "ChannelView",
    "DaemonView",
    "DomainView",
    "FabricView",
    "JobView",
    "Status",
    "collect",
    "command",
    "live_of",
    "render_text",
]


class FabricView(Record):
    """The tray's NVLink domain key and fabric health, from one NVML read (``gpu.topology.read_tray``)."""

    fabric: str
    key: str | None
    health: str
    reason: str
    error: str

    def data(self) -> JsonObject:
        """The ``fabric`` object of ``--json``."""
        return self._asdict()


class DaemonView(Record):
    """What the backend says of a job's daemon, with its pid and uptime from ``/proc`` where a process shows.

    ``info`` is None when the backend could not be asked (``error`` says why).
    """

    info: DaemonInfo | None
    error: str = ""
    #: the daemon's process as ``/proc`` shows it (None: none shows)
    pid: int | None = None
    uptime_s: float | None = None

    @property
    def up(self) -> bool:
        """The one rule (``daemon.daemon_runs``): a process shows, the backend says it runs, or it cannot be asked."""
        return self.uptime_s is not None or self.info is None or self.info.running

    def data(self) -> JsonObject:
        """The ``daemon`` object of a job in ``--json``: the backend's fields (or ``error``), then pid and uptime."""
        out: dict[str, object] = {"error": self.error} if self.info is None else dict(self.info._asdict())
        if self.uptime_s is not None:
            out.update(pid=self.pid, uptime_s=self.uptime_s)
        return out  # type: ignore[return-value]  # the backend's record holds only JSON values


class DomainView(Record):
    """The domain as the job's daemon reports it (``nvidia-imex-ctl -N -j``), or why it could not be asked."""

    domain: DomainStatus | None
    error: str = ""

    def data(self) -> JsonObject:
        """The ``domain`` object of a job in ``--json``: its status and nodes, or ``error``."""
        if self.domain is None:
            return {"error": self.error}
        nodes: list[JsonObject] = [
            {
                "id": n.node_id,
                "host": n.host,
                "status": n.status,
                "version": n.version,
                "connections": {str(c.peer_id): c.status for c in n.connections},
            }
            for n in self.domain.nodes
        ]
        return {"status": self.domain.status, "nodes": nodes}


class JobView(Record):
    """One job with a directory or a daemon on this tray, and what is stale about it."""

    job_id: int
    job_dir: str
    daemon: DaemonView
    #: what its prolog recorded (None: no readable ``state.json``)
    state: JobState | None
    nodes_config: tuple[str, ...]
    domain: DomainView | None
    #: the job may still run here (cleanup's rule, ``jobs.still_runs``)
    running: bool
    #: its domain was set up and its daemon ended before the job (the epilog's ``imex.daemon.lost``, asked now)
    lost: bool
    stale: tuple[str, ...]

    def data(self) -> JsonObject:
        """The job's object in ``--json``'s ``jobs``."""
        out: dict[str, object] = {"job_id": self.job_id, "job_dir": self.job_dir, "stale": list(self.stale)}
        out["daemon"] = self.daemon.data()
        st = self.state
        if st is not None:
            out.update(user=st.user, uid=st.uid, port=st.port, cmd_port=st.cmd_port)
            out.update(trays=list(st.nodes), addresses=list(st.addresses))
            if st.channel_minor is not None:
                out["channel"] = {"path": st.channel_path, "minor": st.channel_minor}
        out["nodes_config"] = list(self.nodes_config)
        out["domain"] = self.domain.data() if self.domain is not None else None
        out.update(running=self.running, lost=self.lost)
        return out  # type: ignore[return-value]  # built from JSON values only


class ChannelView(Record):
    """One channel node in ``[paths] channel_dir``; ``stale`` when no job claims it or may (not channel0)."""

    path: str
    minor: int
    owner: str
    uid: int
    mode: str
    stale: bool

    def data(self) -> JsonObject:
        """The channel's object in ``--json``'s ``channels``."""
        return self._asdict()


class Status(Record):
    """This tray as ``imexctl status`` sees it: its fabric, its jobs' domains, its channels, what is stale."""

    node: str
    #: the config file this status read: the one the hooks read under slurmd (None: built-in defaults)
    config: str | None
    #: the one job whose domain this tray runs (None: none, or several)
    owner_job: int | None
    #: None with ``[policy] fabric = none`` (or when the caller did not ask NVML)
    fabric: FabricView | None
    jobs: tuple[JobView, ...]
    channels: tuple[ChannelView, ...]
    stale: tuple[str, ...]

    def data(self) -> JsonObject:
        """``status --json``'s ``data``."""
        return {
            "node": self.node,
            "config": self.config,
            "owner_job": self.owner_job,
            "fabric": self.fabric.data() if self.fabric is not None else None,
            "jobs": [j.data() for j in self.jobs],
            "channels": [c.data() for c in self.channels],
            "stale": list(self.stale),
        }


def collect(rt: Runtime, node: str, *, nvml: bool = True) -> Status:
    """Owner job, daemon, port, nodes, domain and peer states, channels, staleness.

    ``nvml=False``: the fabric is not read (``fabric`` is None), as with ``[policy] fabric = none``.
    """
    paths = rt.settings.paths
    jobs = tuple(_job(jid, rt) for jid in known_jobs(rt))
    claimed = {j.state.channel_minor for j in jobs if j.state is not None and j.state.channel_minor is not None}
    # a job that may still run here with a state that cannot be read may claim any channel: cleanup's rule
    unread = any(j.state is None and j.running for j in jobs)
    channels = tuple(_channel(c, claimed, unread) for c in devices.list_channels(paths.channel_dir))
    stale = [f"job {j.job_id}: {why}" for j in jobs for why in j.stale]
    stale += [f"channel {c.path}: not owned by any job" for c in channels if c.stale]
    return Status(
        node,
        str(rt.settings.source) if rt.settings.source else None,
        jobs[0].job_id if len(jobs) == 1 else None,
        _fabric(rt, node) if nvml else None,
        jobs,
        channels,
        tuple(stale),
    )


def _fabric(rt: Runtime, node: str) -> FabricView | None:
    """The tray's NVLink domain key and fabric health (one NVML read, no wait); None with ``fabric = none``."""
    if rt.settings.policy.fabric != "nvml":
        return None
    from imexctl.gpu.topology import read_tray

    tray = read_tray(rt.gpu, node)
    return FabricView(tray.fabric, tray.key, tray.health, tray.reason, tray.error)


def _job(job_id: int, rt: Runtime) -> JobView:
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    said = _daemon(jd, state, rt)
    running = still_runs(job_id, rt).runs  # cleanup's rule: a set-up domain without a step counts
    lost = _lost(state, said)
    stale = [] if running else ["job no longer runs on this node"]
    if not said.up:
        # one entry per fact, each its own fixed text (the faults' soak and scripts match them whole)
        stale.append("no daemon process")
    if lost:
        stale.append("daemon lost: it ended before the job")
    if not jd.exists():
        stale.append("daemon without job directory")
    domain = _domain(jd.config, rt) if said.up else None
    return JobView(job_id, str(jd.path), said, state, tuple(_read(jd.nodes)), domain, running, lost, tuple(stale))


def _daemon(jd: JobDir, state: JobState | None, rt: Runtime) -> DaemonView:
    """What the backend says of the job's daemon, its pid and uptime from ``/proc``.

    Whether it runs is the one rule (``daemon.daemon_runs``, :attr:`DaemonView.up`):
    a daemon that ``/proc`` no longer ties to the program (its executable moved
    under it) runs while its backend says so, and a backend that cannot be
    asked counts as running.
    """
    host, s = rt.host, rt.settings
    backend = daemon.make_backend(host, s, state.backend if state else None)
    try:
        said = DaemonView(backend.info(jd))
    except ImexctlError as exc:
        said = DaemonView(None, str(exc))
    # with systemd, the unit's main process is the daemon whatever it runs (a site's wrapper)
    info = said.info
    main = (info.pid or 0) if info is not None and info.backend == "systemd" else 0
    procs = daemon.job_processes(host, s, jd.config, main_pid=main)
    if procs:
        # both on the boot clock: a stepped wall clock changes neither; never negative
        said = said._replace(pid=procs[0].pid, uptime_s=round(max(0.0, host.since_boot() - procs[0].create_time), 1))
    return said


def _lost(state: JobState | None, said: DaemonView) -> bool:
    """The epilog's rule (``imex.daemon.lost``), asked now: a set-up domain, not ended here, without its daemon.

    A prolog still at work (no ``set_up`` mark) or an epilog at work (``ended``) is no loss, and neither is a
    daemon the backend could not be asked about.
    """
    if state is None or not state.set_up or state.ended or state.backend == "none":
        return False
    return not said.up


def _domain(config: Path, rt: Runtime) -> DomainView:
    from imexctl.imex import ctl as ctloutput

    argv = (rt.settings.commands.nvidia_imex_ctl, "-c", str(config), "-N", "-j")
    try:
        done = rt.host.run(argv, timeout_s=rt.settings.readiness.ctl_timeout_s)
        return DomainView(ctloutput.parse_domain_json(done.stdout))
    except (CommandError, ImexctlError) as exc:
        return DomainView(None, str(exc))


def _channel(c: devices.Channel, claimed: set[int], unread: bool) -> ChannelView:
    """The channel as status shows it; stale only when no job claims it and none may (``unread``: see ``collect``)."""
    import pwd

    try:
        owner = pwd.getpwuid(c.uid).pw_name
    except KeyError:
        owner = str(c.uid)
    stale = c.minor not in claimed and c.minor != 0 and not unread
    return ChannelView(str(c.path), c.minor, owner, c.uid, f"{c.mode:04o}", stale)


def _read(path: Path) -> list[str]:
    try:
        return read_text_nofollow(path).split()
    except OSError:
        return []


def _fabric_line(fabric: FabricView | None) -> str:
    if fabric is None:
        return "NVLink domain: not checked ([policy] fabric = none)"
    if fabric.key:
        return f"NVLink domain: {fabric.key}, fabric health {fabric.health}"
    if fabric.error:
        return f"NVLink domain: unknown ({fabric.error})"
    return f"NVLink domain: none (no multi-node NVLink fabric: {fabric.reason})"


def _job_lines(j: JobView) -> list[str]:
    st, d = j.state, j.daemon
    user, port, cmd_port = (st.user, st.port, st.cmd_port) if st is not None else ("?", "?", "?")
    running = "running" if j.running else "not running"
    lines = [f"job {j.job_id} (user {user}, port {port}, command port {cmd_port}, {running})"]
    said = (d.info.backend, d.info.unit, d.info.state) if d.info is not None else ("?", "", d.error)
    what = " ".join(str(x) for x in said if x)
    pid = d.pid if d.uptime_s is not None else (d.info.pid if d.info is not None else None)
    uptime = d.uptime_s if d.uptime_s is not None else "-"
    lines.append(f"  daemon: {what}, pid {pid if pid is not None else '-'}, uptime {uptime}s")
    lines.append(f"  nodes_config: {' '.join(j.nodes_config) or '-'}")
    if j.domain is not None and j.domain.domain is not None:
        lines.append(f"  domain: {j.domain.domain.status}")
        for n in j.domain.domain.nodes:
            conns = " ".join(f"{k}:{v}" for k, v in sorted((str(c.peer_id), c.status) for c in n.connections))
            lines.append(f"    node {n.node_id} {n.host} {n.status} v{n.version}  {conns}")
    elif j.domain is not None:
        lines.append(f"  domain: unknown ({j.domain.error})")
    return lines


def render_text(st: Status) -> str:
    """Human-readable status."""
    lines = [f"node: {st.node}", f"config: {st.config or 'none (built-in defaults)'}", _fabric_line(st.fabric)]
    lines.append(f"owner job: {st.owner_job if st.owner_job is not None else '-'}")
    if not st.jobs:
        lines.append("no IMEX domain on this node")
    for j in st.jobs:
        lines += _job_lines(j)
    lines += [
        f"channel {c.path} minor {c.minor} owner {c.owner} mode {c.mode}" + (" STALE" if c.stale else "")
        for c in st.channels
    ]
    lines += [f"stale: {s}" for s in st.stale] or ["stale: nothing"]
    return "\n".join(lines) + "\n"


def _live(rt: Runtime, node: str) -> tuple[str, str]:
    """The live gauges' text (``--prometheus``, ``--textfile``) and the tray's block.

    NVML is asked only when no topology names the block.
    """
    from imexctl.commands import live
    from imexctl.hooks import members

    try:
        source = members.load_source(rt.settings)
    except ImexctlError:
        source = None  # the prolog says what is wrong with it; the gauges still come
    block = members.block_label(node, source, None)
    found = collect(rt, node, nvml=not block)
    if not block and found.fabric is not None:
        block = members.block_label(node, None, found.fabric.key)
    gauges = live_of(found, block)._replace(version=_versions(rt))
    return live.render(gauges, rt.host.time()), block


def _versions(rt: Runtime) -> tuple[Pending, ...]:
    """The package's version in use and one installed beside it, under ``[paths] root`` (a live gauge)."""
    from imexctl import __version__
    from imexctl.platform import versions

    top = rt.settings.paths.root / versions.TOP.lstrip("/")
    return versions.pending(versions.read(str(top)), __version__)


def live_of(found: Status, block: str) -> Live:
    """The live gauges of this tray now (:mod:`imexctl.commands.live`), from its status.

    A job whose daemon is lost counts there, not among the leftovers; its
    domain is ``down`` on this tray.
    """
    from imexctl.commands.live import Live

    domain = _domain_of(found)
    lost = sum(1 for j in found.jobs if j.lost)
    if domain.owner_job and any(j.lost and j.job_id == domain.owner_job for j in found.jobs):
        domain = domain._replace(state="down", connected=None)
    stale_jobs = sum(1 for j in found.jobs if not j.running and not j.lost)
    stale_channels = sum(1 for c in found.channels if c.stale)
    return Live(domain, lost, stale_jobs, stale_channels, block)


def _domain_of(found: Status) -> Domain:
    """The domain gauges: the owner job's ``-N`` view from this tray."""
    from imexctl.hooks.metrics import Domain

    if found.owner_job is None or not found.jobs:
        return Domain() if not found.jobs else Domain(0, "unknown")
    job = found.jobs[0]
    trays = job.state.nodes if job.state is not None else ()
    peers = max(len(trays) - 1, 0)
    if job.domain is None or job.domain.domain is None:
        return Domain(job.job_id, "unknown", peers)
    dom = job.domain.domain
    own = _own_address(job.state, found.node)
    me = next((n for n in dom.nodes if n.host == own), None)
    connected = None
    if me is not None:
        connected = sum(c.status == "CONNECTED" for c in me.connections if c.peer_id != me.node_id)
    return Domain(job.job_id, dom.status.lower(), peers, connected)


def _own_address(state: JobState | None, node: str) -> str:
    if state is None or node not in state.nodes or len(state.addresses) != len(state.nodes):
        return ""
    return state.addresses[state.nodes.index(node)]


def write_textfile(rt: Runtime, node: str) -> Path:
    """Replace ``<textfile_dir>/imexctl-live.prom`` atomically (``status --textfile``: the live-gauge timer).

    Raises:
        ConfigError: ``[metrics] textfile_dir`` is not set.
        FileError: the file cannot be written (a missing directory, a full disk).
    """
    from imexctl.commands import live
    from imexctl.platform.errors import ConfigError, FileError
    from imexctl.platform.fsutil import atomic_write

    target = live.textfile(rt.settings)
    if target is None:
        raise ConfigError("status --textfile: [metrics] textfile_dir is not set (docs/metrics.md)")
    text, block = _live(rt, node)
    from imexctl.hooks import metrics

    try:
        metrics.check_textfile_dir(target.parent)
        atomic_write(target, text, mode=0o644)
    except OSError as exc:
        raise FileError(f"{target}: {exc.strerror or exc}") from exc
    try:  # where a hook or a refresh whose config does not load writes (metrics.fallback), and the block
        metrics.remember(rt.settings, block)
    except OSError as exc:
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")
    return target


def _unloaded(env: Mapping[str, str], host: Host | None, *, textfile: bool) -> None:
    """The live gauges of a config file that does not load (``live.render_unloaded``): written or printed.

    ``--textfile`` writes them into the fallback's directory (``metrics.fallback``);
    a file that cannot be written is a warning, the command's failure the config's.
    """
    import time

    import structlog

    from imexctl.commands import live
    from imexctl.slurm.job import node_name

    now = host.time() if host is not None else time.time()
    try:
        node = node_name(env, or_host=True)
        if not textfile:
            from imexctl.hooks.metrics import fallback, remembered

            settings = fallback(node)
            sys.stdout.write(live.render_unloaded(remembered(settings)[1] if settings is not None else "", now))
            return
        live.write_unloaded(node, now)
    except (OSError, ImexctlError) as exc:
        structlog.get_logger().warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, gpu: Gpu | None) -> int:
    """``imexctl status``: text, ``--json`` (the result envelope), ``--prometheus`` or ``--textfile`` (live gauges)."""
    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import ConfigError

    textfile = getattr(args, "textfile", False)
    try:
        built = build("status", env, Needs(logs="command"), config=args.config, verbose=args.verbose, host=host,
                      gpu=gpu)  # fmt: skip
    except ConfigError:
        if textfile or args.prometheus:  # the live gauges say so, where the hooks count it (docs/metrics.md)
            _unloaded(env, host, textfile=textfile)
        raise
    rt, node = built.rt, built.node
    if textfile:
        write_textfile(rt, node)
        return 0
    if args.prometheus:
        sys.stdout.write(_live(rt, node)[0])
        return 0
    found = collect(rt, node)
    if args.json:
        print_json(found)
    else:
        sys.stdout.write(render_text(found))
    return 0
