"""Teardown of one job's domain on this node, and the two commands built on it: epilog and cleanup.

``teardown`` is the same code for the epilog, for a failing prolog's roll-back
and for ``imexctl cleanup``.  It is idempotent and touches only the one job:
stop its daemon, make sure no process of it survives, remove its channel and
its directory.  Every step runs even if an earlier one failed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from imexctl.channels import devices, notes
from imexctl.config.paths import JobDir
from imexctl.hooks.runtime import Runtime, bind, log_failed
from imexctl.hooks.state import JobState, job_ids, mark_state, node_lock, read_state
from imexctl.imex import daemon
from imexctl.platform.errors import DaemonLostError, DeviceError, ImexctlError, UnsafeNodeError
from imexctl.platform.fsutil import remove_tree
from imexctl.platform.host import ProcInfo
from imexctl.slurm.job import JobContext

__all__ = ["cleanup", "epilog", "idle_epilog", "known_jobs", "scan_jobs", "still_runs", "teardown"]


class _Steps:
    """Runs teardown steps, one per object, collecting what was done and what failed (or, dry, what would be done).

    Each object (the daemon, the channel, the job directory) is one item, named
    the same way whether it is done or only planned: ``cleanup --dry-run`` lists
    ``would <item>`` for exactly the items that ``cleanup`` then reports as
    ``<item>``, or ``<item> (<detail>)`` when it had to force something.
    """

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.done: list[str] = []
        self.problems: list[str] = []

    def run(self, what: str, action: Callable[[], Any]) -> None:
        """Do one item (or, dry, name it); a failure is kept in ``problems``."""
        if self.dry_run:
            self.done.append(f"would {what}")
            return
        try:
            result = action()
        except (ImexctlError, OSError) as exc:
            self.problems.append(f"{what}: {exc}")
            return
        # an action may say what it had to force: "stop daemon of job 7 (<unit>: systemd sent SIGKILL ...)"
        self.done.append(f"{what} ({result})" if isinstance(result, str) and result else what)


def teardown(job_id: int, rt: Runtime, *, dry_run: bool = False) -> list[str]:
    """Remove job ``job_id``'s daemon, channel and files from this node; idempotent.

    Each item (daemon, channel, directory) is there when what it names is
    there, by the same checks with and without ``dry_run``; a dry run only
    names the items.

    Returns:
        What was done (or, with ``dry_run``, what would be done): one item per object.

    Raises:
        UnsafeNodeError: a daemon survived or the channel could not be removed.
    """
    jd, steps = rt.settings.paths.job(job_id), _Steps(dry_run)
    state = read_state(jd)
    with_backend = jd.exists() and not (state and state.backend == "none")  # "none": a channel-only job
    if with_backend or daemon.job_processes(rt.host, rt.settings, jd.config, with_clients=True):
        steps.run(f"stop daemon of job {job_id}", lambda: _stop_daemon(jd, state, with_backend, rt))
        _step(rt, dry_run, "daemon_stopped")
    chan = _channel_of(job_id, state, rt)
    if chan is not None:
        steps.run(f"remove channel {chan[0]}", lambda: devices.remove_channel(*chan))
        _step(rt, dry_run, "channel_removed")
    if jd.exists():
        steps.run(f"remove {jd.path}", lambda: remove_tree(jd.path))
        _step(rt, dry_run, "removed")
    if steps.problems:
        raise UnsafeNodeError("; ".join(steps.problems))
    return steps.done


def _step(rt: Runtime, dry_run: bool, name: str) -> None:
    if not dry_run:
        rt.step(name)


def _stop_daemon(jd: JobDir, state: JobState | None, with_backend: bool, rt: Runtime) -> str:
    """Stop the job's daemon through its backend, then make sure no process of it survives.

    A failed stop is only a problem if a daemon survives: the kill decides.

    Returns:
        What had to be forced or failed on the way ("" when the daemon simply stopped).

    Raises:
        UnsafeNodeError: a daemon process survives SIGKILL.
    """
    notes = []
    if with_backend:
        backend = daemon.make_backend(rt.host, rt.settings, state.backend if state else None)
        try:
            forced = backend.stop(jd)
        except (ImexctlError, OSError) as exc:
            notes.append(f"stop failed: {exc}")
        else:
            if forced:
                rt.log.warning("imex.daemon.killed", config=str(jd.config), by=forced)
                notes.append(forced)
    try:
        killed = daemon.ensure_gone(rt.host, rt.settings, jd.config)
    except UnsafeNodeError as exc:
        raise UnsafeNodeError("; ".join([*notes, str(exc)])) from exc
    if killed:
        rt.log.warning("imex.daemon.killed", pids=killed, config=str(jd.config))
        notes.append(f"SIGKILL to pid {', '.join(map(str, killed))}")
    else:
        rt.log.info("imex.daemon.stopped", config=str(jd.config))
    return "; ".join(notes)


def _channel_of(job_id: int, state: JobState | None, rt: Runtime) -> tuple[Path, int] | None:
    """The job's channel ``(path, minor)`` if there is one here that may be removed, else None."""
    if state is not None:
        if state.channel_minor is None or not os.path.lexists(state.channel_path):
            return None
        return Path(state.channel_path), state.channel_minor
    if rt.settings.policy.channels != "job":
        return None
    # No state (the prolog died early): our minor, unless another job's state claims it.
    paths = rt.settings.paths
    minor = devices.channel_minor(job_id, rt.settings.policy.channel_count)
    path = devices.channel_path(paths.channel_dir, minor)
    for other in job_ids(paths.jobs_dir):
        st = read_state(paths.job(other))
        if other != job_id and (st is None or st.channel_minor == minor):
            return None
    return (path, minor) if os.path.lexists(path) else None


def epilog(env: Mapping[str, str], rt: Runtime) -> dict[str, Any]:
    """Tear down this job's domain on this node; safe after a failed or missing prolog.

    A daemon that ended before the job is reported (``imex.daemon.lost``);
    with ``[policy] lost_daemon = drain`` the epilog then fails, after the
    teardown, so that Slurm drains the tray.
    """
    t0 = rt.host.monotonic()
    lost: list[str] = []
    try:
        job = JobContext.from_env(env, need_nodes=False)
        bind(rt, job_id=job.job_id, node=job.node)
        notes.forget(str(rt.settings.paths.run_dir), job.job_id)
        actions: list[str] = []
        for jid in _domains(job):
            if _left_anything(rt.settings.paths.job(jid), rt):
                _mark_ended(rt.settings.paths.job(jid), rt)  # first: even a lock timeout leaves it for cleanup
                with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.daemon.lock_timeout_s):
                    rt.step("locked")
                    lost += _lost_daemon(jid, rt)
                    actions += teardown(jid, rt)
        if lost and rt.settings.policy.lost_daemon == "drain":
            raise DaemonLostError(
                f"{'; '.join(lost)}; [policy] lost_daemon = drain: the tray is clean, see why the daemon "
                f"ended ([paths] imex_log_file, journalctl -u {rt.settings.daemon.unit}@<job>), then resume it",
                len(lost),
            )
    except ImexctlError as exc:
        log_failed("epilog.done", exc, rt, t0)
        raise
    return _epilog_done(rt, t0, actions, lost)


def _lost_daemon(job_id: int, rt: Runtime) -> list[str]:
    """``["the IMEX daemon of job N ended before the job: <how>"]`` when it did, else [].

    Only a domain whose prolog finished (``set_up``) had a daemon that should
    still run when its epilog starts: the epilog stops it.  When the backend
    cannot be asked (systemd does not answer), nothing is claimed.
    """
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    if state is None or not state.set_up or state.backend == "none":
        return []
    if daemon.job_processes(rt.host, rt.settings, jd.config):
        return []  # the common case, from /proc alone: systemd is asked only about a daemon that is gone
    try:
        info = daemon.make_backend(rt.host, rt.settings, state.backend).info(jd)
    except (ImexctlError, OSError):
        return []
    if info.running:
        return []
    how = info.ended or "not running"
    rt.log.warning("imex.daemon.lost", domain_job_id=job_id, backend=state.backend, how=how)
    return [f"the IMEX daemon of job {job_id} ended before the job: {how}"]


def idle_epilog(env: Mapping[str, str], rt: Runtime) -> dict[str, Any] | None:
    """The whole epilog of a job that left nothing here; None (nothing logged) when the full epilog must run.

    Most jobs never had a domain on a tray.  ``cli`` runs this first, with a
    ``log.LineLogger``, so that their epilog imports neither structlog nor
    psutil (docs/performance.md).  The checks are the full epilog's.
    """
    t0 = rt.host.monotonic()
    try:
        job = JobContext.from_env(env, need_nodes=False)
        notes.forget(str(rt.settings.paths.run_dir), job.job_id)
        if any(_left_anything(rt.settings.paths.job(jid), rt) for jid in _domains(job)):
            return None
    except (ImexctlError, OSError):
        return None
    bind(rt, job_id=job.job_id, node=job.node)
    return _epilog_done(rt, t0, [])


def _domains(job: JobContext) -> list[int]:
    """The job ids whose domain this epilog tears down: a het job's is keyed by the het job id."""
    return list(dict.fromkeys([job.job_id, *([job.het_job_id] if job.het_job_id else [])]))


def _epilog_done(rt: Runtime, t0: float, actions: list[str], lost: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True, "actions": actions, "duration_s": round(rt.host.monotonic() - t0, 3)}
    if lost:
        out["lost_daemon"] = lost
    rt.log.info("epilog.done", **out)
    return out


def _mark_ended(jd: JobDir, rt: Runtime) -> None:
    """Record in the job's state that its epilog runs here, so ``cleanup`` knows the job has ended.

    Written before the node lock is taken, so an epilog that times out on the
    lock still leaves its job to plain ``cleanup``.  Without the lock it may
    race a prolog of the same job, which slurmd never runs at the same time
    (design.md source slurm-prolog-order); a lost mark only makes ``cleanup``
    more careful.  Best effort: if the state cannot be written, teardown
    (which removes it) reports the problem.
    """
    try:
        mark_state(jd, ended=rt.host.time())
    except OSError:
        pass


def _left_anything(jd: JobDir, rt: Runtime) -> bool:
    """Whether the job left anything here.

    Most jobs never had a domain on a tray: their epilog takes no lock, so it
    never waits for another job's prolog.
    """
    return (
        jd.exists()
        or bool(daemon.job_processes(rt.host, rt.settings, jd.config, with_clients=True))
        or _channel_of(jd.job_id, None, rt) is not None
    )


def cleanup(rt: Runtime, *, job_id: int | None = None, dry_run: bool = False, force: bool = False) -> dict[str, Any]:
    """Reset the node after failed jobs: tear down every job no longer running here.

    Which jobs may still run is decided locally (slurmctld is never asked), see
    :func:`still_runs`.  ``force`` tears down running jobs too.  Stray channels
    (not channel0) are removed when imexctl owns channels.
    """
    report: dict[str, Any] = {"dry_run": dry_run, "actions": [], "skipped": [], "errors": []}
    planned: set[Path] = set()  # channels that teardown removes: a dry run must not name them twice
    with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.daemon.lock_timeout_s):
        rt.step("locked")
        for jid in [job_id] if job_id is not None else known_jobs(rt):
            why = "" if force else still_runs(jid, rt)
            if why:
                report["skipped"].append(f"job {jid} {why} (use --force)")
                continue
            chan = _channel_of(jid, read_state(rt.settings.paths.job(jid)), rt)
            planned |= {chan[0]} if chan else set()
            try:
                report["actions"] += teardown(jid, rt, dry_run=dry_run)
            except UnsafeNodeError as exc:
                report["errors"].append(str(exc))
        if job_id is None and rt.settings.policy.channels == "job":
            report["actions"] += _remove_stray_channels(rt, dry_run, planned)
        report["actions"] += _remove_notes(rt, job_id, dry_run, force)
    rt.log.info("cleanup.done", **report)
    if report["errors"]:
        raise UnsafeNodeError("; ".join(report["errors"]))
    return report


def still_runs(job_id: int, rt: Runtime) -> str:
    """Why job ``job_id`` may still run on this node ('' when it surely does not).

    A slurmstepd or a cgroup of the job proves it runs.  Their absence does not
    prove the opposite: a job has neither on a node before its first step
    there, which with ``PrologFlags=Alloc`` (without ``Contain``) can be the
    whole job, and even ``Contain`` starts the extern step only after the
    prolog (design.md source slurm-prolog-order).  So a job whose prolog set up
    its domain, which is still there, and whose epilog has not run here, counts
    as running too: when in doubt, leave it.
    """
    if rt.host.job_is_running(job_id):
        return "still runs on this node"
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    if state is None or not state.set_up or state.ended:
        return ""
    if state.backend == "none":
        live = bool(state.channel_path) and os.path.lexists(state.channel_path)
    else:
        live = bool(daemon.job_processes(rt.host, rt.settings, jd.config))
    if not live:
        return ""
    return (
        "may still run on this node: its domain is set up and its epilog has not run here, "
        "and a job has no slurmstepd or cgroup on a node before its first step there"
    )


def known_jobs(rt: Runtime) -> list[int]:
    """Jobs with a directory or a daemon process under this node's jobs directory (a pager on a file is none)."""
    return scan_jobs(rt)[0]


def scan_jobs(rt: Runtime) -> tuple[list[int], list[ProcInfo]]:
    """:func:`known_jobs`, and the IMEX daemons under the jobs directory that name no job id (strays).

    One look at ``/proc`` answers both (the prolog's claim needs both).
    """
    jobs = set(job_ids(rt.settings.paths.jobs_dir))
    prefix = f"{rt.settings.paths.jobs_dir}/"
    strays = []
    for proc in daemon.imex_processes(rt.host, rt.settings, prefix, prefix=True):
        heads = [arg[len(prefix) :].split("/", 1)[0] for arg in proc.cmdline if arg.startswith(prefix)]
        ids = [int(head) for head in heads if head.isdigit()]
        jobs.update(ids)
        if not ids:
            strays.append(proc)
    return sorted(jobs), strays


def _remove_notes(rt: Runtime, job_id: int | None, dry_run: bool, force: bool) -> list[str]:
    """Remove the TaskProlog notes (``notes``) of jobs that no longer run here (of ``job_id`` only, if given)."""
    notes_dir = rt.settings.paths.run_dir / notes.NOTES
    try:
        names = sorted(os.listdir(notes_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for jid in sorted(int(n) for n in names if n.isascii() and n.isdigit()):
        if (job_id is not None and jid != job_id) or (not force and rt.host.job_is_running(jid)):
            continue
        what = f"remove note of job {jid}"
        if dry_run:
            out.append(f"would {what}")
        elif notes.forget(str(rt.settings.paths.run_dir), jid):
            out.append(what)
    return out


def _remove_stray_channels(rt: Runtime, dry_run: bool, planned: set[Path]) -> list[str]:
    """Remove channel nodes that no job claims (not channel0), except those that teardown removes already."""
    paths = rt.settings.paths
    claimed = {st.channel_minor for j in job_ids(paths.jobs_dir) if (st := read_state(paths.job(j)))}
    out = []
    for chan in devices.list_channels(paths.channel_dir):
        if chan.minor == 0 or chan.minor in claimed or chan.path in planned:
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
