"""The hooks and admin commands as ordered, idempotent steps over injected seams.

``prolog`` sets up this node's part of the job's IMEX domain or undoes all of it;
``teardown`` (used by the epilog, by cleanup and by a failing prolog) removes one
job's daemon, channel and files and never touches another job's.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from imexctl import daemon, devices, domain, imexconf
from imexctl.errors import (
    ConfigError, DeviceError, DomainBusyError, FileError, ImexctlError, UnsafeNodeError,
)  # fmt: skip
from imexctl.fsutil import atomic_write, ensure_dir, remove_tree
from imexctl.gpu import Gpu, fabric_key
from imexctl.host import Host, ProcInfo
from imexctl.settings import Settings
from imexctl.slurm import JobContext, constraint_features
from imexctl.state import JobState, job_ids, node_lock, read_state, write_state

__all__ = ["Runtime", "cleanup", "epilog", "known_jobs", "prolog", "teardown"]

CONFIG_FILE, NODES_FILE = "config.cfg", "nodes_config.cfg"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The seams every step receives."""

    host: Host
    gpu: Gpu
    settings: Settings
    log: Any


def _bind(**kw: Any) -> None:
    import structlog

    structlog.contextvars.bind_contextvars(**kw)


# ---------------------------------------------------------------- prolog


def prolog(env: Mapping[str, str], rt: Runtime) -> Dict[str, Any]:
    """Set up the job's IMEX domain on this tray, or roll back and raise.

    Returns:
        The summary logged as ``prolog.done`` (one line per run, also on failure).
    """
    t0 = rt.host.monotonic()
    try:
        return _prolog(env, rt, t0)
    except ImexctlError as exc:
        _failed("prolog.done", exc, rt, t0)
        raise


def _failed(event: str, exc: ImexctlError, rt: Runtime, t0: float) -> None:
    """The one summary line of a failed hook run; cli.main then logs nothing more."""
    rt.log.error(event, ok=False, error_code=exc.code, exit_code=int(exc.exit_code), reason=str(exc),
                 duration_s=round(rt.host.monotonic() - t0, 3))  # fmt: skip
    exc.logged = True  # type: ignore[attr-defined]


def _prolog(env: Mapping[str, str], rt: Runtime, t0: float) -> Dict[str, Any]:
    deadline = t0 + rt.settings.get("readiness", "deadline_s")
    job = JobContext.from_env(env, need_nodes=True)
    _bind(job_id=job.job_id, node=job.node)
    skip = _gate(job, rt) or _shared(job, rt)
    nvml = not skip and rt.settings.get("policy", "fabric") == "nvml"
    if nvml and fabric_key(rt.gpu, rt.host, rt.settings, deadline=deadline, log=rt.log) is None:
        skip = "this tray has no multi-node NVLink fabric (NVML)"
    if skip:
        return _done(rt, t0, skipped=skip)
    members = domain.domain_members(job.nodes, job.node, rt.settings.paths.topology_file)
    with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.get("daemon", "lock_timeout_s")):
        _claim(job, rt)
        try:
            summary = _setup_files_checked(job, members, rt, deadline)
        except BaseException as exc:
            _rollback(job.job_id, rt, exc)
            raise
    return _done(rt, t0, **summary)


def _done(rt: Runtime, t0: float, *, skipped: str = "", **summary: Any) -> Dict[str, Any]:
    out = {"ok": True, **summary, "duration_s": round(rt.host.monotonic() - t0, 3)}
    if skipped:
        rt.log.info("imex.skipped", reason=skipped)
        out["skipped"] = skipped
    rt.log.info("prolog.done", **out)
    return out


def _gate(job: JobContext, rt: Runtime) -> str:
    """Why this job gets no IMEX by policy ('' when it does)."""
    policy = rt.settings.values["policy"]
    if policy["jobs"] == "partitions" and job.partition not in policy["partitions"]:
        return f"partition {job.partition or '?'} is not in [policy] partitions"
    if policy["jobs"] == "feature" and policy["feature"] not in constraint_features(job.constraints):
        return f"job did not request feature {policy['feature']!r} (--constraint)"
    return ""


def _shared(job: JobContext, rt: Runtime) -> str:
    """Skip (policy ``skip``) or refuse a job that may share its nodes; '' for an exclusive job."""
    if not job.is_shared:
        return ""
    why = f"job may share its nodes (SLURM_JOB_OVERSUBSCRIBE={job.oversubscribe}); IMEX needs --exclusive"
    if rt.settings.get("policy", "shared") == "skip":
        return why
    raise DomainBusyError(why)


def _claim(job: JobContext, rt: Runtime) -> None:
    """Refuse a node whose domain is held by another job or a stray daemon; clear our own leftovers."""
    paths = rt.settings.paths
    others = [j for j in job_ids(paths.jobs_dir) if j != job.job_id]
    if others:
        raise DomainBusyError(f"this node's IMEX domain belongs to job {others[0]} "
                              f"(run 'imexctl cleanup' if that job is gone)")  # fmt: skip
    strays = [p for p in rt.host.processes_with_arg(f"{paths.jobs_dir}/", prefix=True)
              if f"{paths.job_dir(job.job_id)}/" not in " ".join(p.cmdline)]  # fmt: skip
    if strays:
        raise DomainBusyError(f"a stray IMEX daemon runs (pid {strays[0].pid}: {' '.join(strays[0].cmdline)})")
    if paths.job_dir(job.job_id).exists():
        rt.log.warning("state.removed", reason="leftovers of an earlier run of this job",
                       actions=teardown(job.job_id, rt))  # fmt: skip


def _setup_files_checked(job: JobContext, members: Tuple[str, ...], rt: Runtime, deadline: float) -> Dict[str, Any]:
    try:
        return _setup(job, members, rt, deadline)
    except OSError as exc:  # our own files: a full or read-only /run, a symlink where a directory belongs
        raise FileError(f"{exc.filename or 'file'}: {exc.strerror or exc}") from exc


def _setup(job: JobContext, members: Tuple[str, ...], rt: Runtime, deadline: float) -> Dict[str, Any]:
    from imexctl import health

    s, paths, host = rt.settings, rt.settings.paths, rt.host
    addresses = domain.resolve_all(members, method=s.get("resolve", "method"), host=host, hosts_file=paths.hosts_file)
    own = addresses[members.index(job.node)]
    rt.log.info("imex.nodes.resolved", trays=list(members), addresses=list(addresses),
                nodes_hash=imexconf.nodes_hash(addresses))  # fmt: skip
    channel = _plan_channel(job, rt)
    port = imexconf.job_port(job.job_id, s.get("ports", "server_port_range"))
    cmd_port = imexconf.job_port(job.job_id, s.get("ports", "cmd_port_range"))
    config = _write_files(job, addresses, own, (port, cmd_port), rt)
    minor, chan = (channel[1], channel[2]) if channel else (None, None)
    write_state(config.parent, JobState(job.job_id, job.node, *job.owner, job.user, members, addresses, port,
                                        s.get("daemon", "backend"), minor, str(chan or ""), host.time(),
                                        cmd_port))  # fmt: skip
    _check_ports_free(own, {"SERVER_PORT": port, "IMEX_CMD_PORT": cmd_port}, host)
    daemon.make_backend(host, s).start(job.job_id, config)
    rt.log.info("imex.daemon.started", backend=s.get("daemon", "backend"), port=port, cmd_port=cmd_port)
    probe = health.Probe(config, own, addresses, s.get("readiness", "level"), _alive_check(host, config), cmd_port)
    ready = health.wait_ready(host, s, probe, deadline=deadline, log=rt.log)
    if ready.blamed:
        rt.log.warning("imex.peer_blamed", peers=list(ready.blamed), status=ready.status)
    if channel is not None:
        _create_channel(job, *channel, rt)
    return {"trays": len(members), "port": port, "cmd_port": cmd_port, "channel": str(chan or ""),
            "ready": ready.ready, "blamed": list(ready.blamed)}  # fmt: skip


def _plan_channel(job: JobContext, rt: Runtime) -> Optional[Tuple[int, int, Path]]:
    """``(major, minor, path)`` of the job's channel, or None with ``channels = none``.

    Checked before anything starts: the driver must have channels, and the
    minor must lie below the driver's ``NVreg_ImexChannelCount``.
    """
    s, paths = rt.settings, rt.settings.paths
    if s.get("policy", "channels") != "job":
        return None
    major = devices.read_major(paths.proc_devices)
    minor = devices.channel_minor(job.job_id, s.get("policy", "channel_count"))
    devices.check_minor(minor, devices.driver_channel_count(paths.nvidia_params), s.get("policy", "channel_count"))
    return major, minor, devices.channel_path(paths.channel_dir, minor)


def _check_ports_free(address: str, ports: Mapping[str, int], host: Host) -> None:
    for key, port in ports.items():
        if host.port_in_use(address, port):
            raise DomainBusyError(f"{key} {address}:{port} is in use (a stale IMEX daemon?)")


def _alive_check(host: Host, config: Path) -> Callable[[], bool]:
    """Whether the job's daemon still runs: one process-table scan, then cheap pid checks per probe."""
    known: List[ProcInfo] = []

    def alive() -> bool:
        if not known:
            known.extend(daemon.job_processes(host, config))
            return bool(known)
        return any(host.is_alive(p) for p in known)

    return alive


def _write_files(job: JobContext, addresses: Tuple[str, ...], own: str, ports: Tuple[int, int], rt: Runtime) -> Path:
    paths = rt.settings.paths
    job_dir = paths.job_dir(job.job_id)
    ensure_dir(job_dir, 0o755)
    nodes = job_dir / NODES_FILE
    atomic_write(nodes, imexconf.render_nodes(addresses), mode=0o644)
    ensure_dir(paths.imex_log_file.parent)
    config = job_dir / CONFIG_FILE
    text = imexconf.render_config(job_id=job.job_id, port=ports[0], cmd_port=ports[1], bind_ip=own, nodes_path=nodes,
                                  log_file=paths.imex_log_file, overrides=rt.settings.imex)  # fmt: skip
    atomic_write(config, text, mode=0o644)
    rt.log.info("imex.config.written", config=str(config), nodes=str(nodes))
    return config


def _create_channel(job: JobContext, major: int, minor: int, path: Path, rt: Runtime) -> None:
    devices.ensure_channel_dir(path.parent)
    if devices.remove_channel(path, minor):
        rt.log.warning("device.channel.removed", path=str(path), reason="stale node of an earlier job")
    mode = rt.settings.get("policy", "channel_mode")
    uid, gid = job.owner
    rt.host.mknod_char(path, major, minor, mode=mode, uid=uid, gid=gid)
    rt.log.info("device.channel.created", path=str(path), major=major, minor=minor, uid=uid, mode=f"{mode:04o}")
    others = [str(c.path) for c in devices.list_channels(path.parent) if c.minor != minor]
    if others:
        rt.log.warning("device.channel.foreign", channels=others)


def _rollback(job_id: int, rt: Runtime, exc: BaseException) -> None:
    """Undo this prolog; if that fails too the node is unsafe and says so (exit 70)."""
    try:
        actions = teardown(job_id, rt)
    except ImexctlError as again:
        rt.log.error("prolog.rolled_back", ok=False, error=str(again))
        raise UnsafeNodeError(f"{exc}; rollback failed too: {again}") from exc
    rt.log.warning("prolog.rolled_back", actions=actions)


# ---------------------------------------------------------------- teardown, epilog


def teardown(job_id: int, rt: Runtime, *, dry_run: bool = False) -> List[str]:
    """Remove job ``job_id``'s daemon, channel and files from this node; idempotent.

    Every step runs even if an earlier one failed.

    Returns:
        What was done (or, with ``dry_run``, what would be done).

    Raises:
        UnsafeNodeError: a daemon survived or the channel could not be removed.
    """
    host, s = rt.host, rt.settings
    job_dir = s.paths.job_dir(job_id)
    config, state = job_dir / CONFIG_FILE, read_state(job_dir)
    done: List[str] = []
    problems: List[str] = []

    def step(what: str, action: Any, *, fatal: bool = True) -> None:
        if dry_run:
            done.append(f"would {what}")
            return
        try:
            if action() is not False:
                done.append(what)
        except (ImexctlError, OSError) as exc:
            (problems.append if fatal else done.append)(f"{what}: {exc}")

    if job_dir.exists():
        backend = daemon.make_backend(host, s, state.backend if state else None)
        # a failed stop is only a problem if a daemon survives: ensure_gone decides below
        step(f"stop daemon of job {job_id}", lambda: backend.stop(job_id, config), fatal=False)
    procs = daemon.job_processes(host, config)
    if procs:
        step(f"kill daemon of job {job_id}", lambda: _kill(config, procs, rt))
    elif job_dir.exists() and not dry_run:
        rt.log.info("imex.daemon.stopped", config=str(config))
    chan = _channel_of(job_id, state, rt)
    if chan is not None:
        step(f"remove channel {chan[0]}", lambda: devices.remove_channel(*chan))
    if job_dir.exists():
        step(f"remove {job_dir}", lambda: remove_tree(job_dir))
    if problems:
        raise UnsafeNodeError("; ".join(problems))
    return done


def _kill(config: Path, procs: List[ProcInfo], rt: Runtime) -> None:
    killed = daemon.ensure_gone(rt.host, rt.settings, config, procs)
    if killed:
        rt.log.warning("imex.daemon.killed", pids=killed, config=str(config))
    else:
        rt.log.info("imex.daemon.stopped", config=str(config))


def _channel_of(job_id: int, state: Optional[JobState], rt: Runtime) -> Optional[Tuple[Path, int]]:
    if state is not None:
        return (Path(state.channel_path), state.channel_minor) if state.channel_minor is not None else None
    if rt.settings.get("policy", "channels") != "job":
        return None
    # No state (the prolog died early): our minor, unless another job's state claims it.
    minor = devices.channel_minor(job_id, rt.settings.get("policy", "channel_count"))
    path = devices.channel_path(rt.settings.paths.channel_dir, minor)
    for other in job_ids(rt.settings.paths.jobs_dir):
        st = read_state(rt.settings.paths.job_dir(other))
        if other != job_id and (st is None or st.channel_minor == minor):
            return None
    return (path, minor) if os.path.lexists(path) else None


def epilog(env: Mapping[str, str], rt: Runtime) -> Dict[str, Any]:
    """Tear down this job's domain on this node; safe after a failed or missing prolog."""
    t0 = rt.host.monotonic()
    try:
        job = JobContext.from_env(env, need_nodes=False)
        _bind(job_id=job.job_id, node=job.node)
        job_dir = rt.settings.paths.job_dir(job.job_id)
        actions: List[str] = []
        # Most jobs never had a domain here: no lock, so an epilog never waits for another job's prolog.
        if job_dir.exists() or daemon.job_processes(rt.host, job_dir / CONFIG_FILE) or _channel_of(job.job_id, None, rt):
            with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.get("daemon", "lock_timeout_s")):
                actions = teardown(job.job_id, rt)
    except ImexctlError as exc:
        _failed("epilog.done", exc, rt, t0)
        raise
    out = {"ok": True, "actions": actions, "duration_s": round(rt.host.monotonic() - t0, 3)}
    rt.log.info("epilog.done", **out)
    return out


# ---------------------------------------------------------------- cleanup


def cleanup(rt: Runtime, *, job_id: Optional[int] = None, dry_run: bool = False, force: bool = False) -> Dict[str, Any]:
    """Reset the node after failed jobs: tear down every job no longer running here.

    A job counts as running while it has a slurmstepd or a cgroup on this node
    (decided locally; slurmctld is never asked).  ``force`` tears down running
    jobs too.  Stray channels (not channel0) are removed when imexctl owns channels.
    """
    host, paths = rt.host, rt.settings.paths
    report: Dict[str, Any] = {"dry_run": dry_run, "actions": [], "skipped": [], "errors": []}
    with node_lock(paths.lock_file, host, rt.settings.get("daemon", "lock_timeout_s")):
        for jid in [job_id] if job_id is not None else known_jobs(rt):
            if host.job_is_running(jid) and not force:
                report["skipped"].append(f"job {jid} still runs on this node (use --force)")
                continue
            try:
                report["actions"] += teardown(jid, rt, dry_run=dry_run)
            except UnsafeNodeError as exc:
                report["errors"].append(str(exc))
        if job_id is None and rt.settings.get("policy", "channels") == "job":
            report["actions"] += _remove_stray_channels(rt, dry_run)
    rt.log.info("cleanup.done", **report)
    if report["errors"]:
        raise UnsafeNodeError("; ".join(report["errors"]))
    return report


def known_jobs(rt: Runtime) -> List[int]:
    """Jobs with a directory or a daemon process under this node's jobs directory."""
    jobs = set(job_ids(rt.settings.paths.jobs_dir))
    prefix = f"{rt.settings.paths.jobs_dir}/"
    for proc in rt.host.processes_with_arg(prefix, prefix=True):
        for arg in proc.cmdline:
            head = arg[len(prefix):].split("/", 1)[0] if arg.startswith(prefix) else ""
            if head.isdigit():
                jobs.add(int(head))
    return sorted(jobs)


def _remove_stray_channels(rt: Runtime, dry_run: bool) -> List[str]:
    paths = rt.settings.paths
    claimed = {st.channel_minor for j in job_ids(paths.jobs_dir) if (st := read_state(paths.job_dir(j)))}
    out = []
    for chan in devices.list_channels(paths.channel_dir):
        if chan.minor == 0 or chan.minor in claimed:
            continue
        if dry_run:
            out.append(f"would remove stray channel {chan.path}")
            continue
        try:
            devices.remove_channel(chan.path, chan.minor)
            out.append(f"remove stray channel {chan.path}")
        except DeviceError as exc:
            out.append(f"could not remove {chan.path}: {exc}")
    return out
