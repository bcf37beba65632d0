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
from imexctl.hooks import remnants
from imexctl.hooks.gate import domains, left_anything, nothing_left
from imexctl.hooks.jobs import GONE, epilog_waits, known_jobs, still_runs
from imexctl.hooks.results import Action, CleanupResult, EpilogResult
from imexctl.hooks.runtime import Runtime, bind, log_failed
from imexctl.hooks.state import JobState, job_ids, mark_state, node_lock, read_state
from imexctl.imex import daemon
from imexctl.platform.errors import DaemonLostError, DeviceError, ImexctlError, UnsafeNodeError
from imexctl.platform.fsutil import remove_tree
from imexctl.slurm import drain
from imexctl.slurm.job import JobContext

__all__ = ["cleanup", "epilog", "idle_epilog", "teardown"]


class _Steps:
    """Runs teardown steps, one per object, collecting what was done and what failed (or, dry, what would be done).

    Each object (the daemon, the channel, the job directory) is one
    :class:`Action`, the same whether it is done or only planned: ``cleanup
    --dry-run`` lists ``would <action>`` for exactly the actions that
    ``cleanup`` then reports, with a ``detail`` when it had to force something.
    """

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.done: list[Action] = []
        self.problems: list[str] = []

    def run(self, planned: Action, action: Callable[[], Any]) -> None:
        """Do one action (or, dry, plan it); a failure is kept in ``problems``."""
        if self.dry_run:
            self.done.append(planned)
            return
        try:
            result = action()
        except (ImexctlError, OSError) as exc:
            self.problems.append(f"{planned.text}: {exc}")
            return
        # a stop says what it had to force: "stop daemon of job 7 (<unit>: systemd sent SIGKILL ...)"
        if isinstance(result, Action):
            planned = result
        self.done.append(planned)


def teardown(job_id: int, rt: Runtime, *, dry_run: bool = False, owner: int | None = None) -> tuple[Action, ...]:
    """Remove job ``job_id``'s daemon, channel and files from this node; idempotent.

    Each action (daemon, channel, directory) is there when what it names is
    there, by the same checks with and without ``dry_run``; a dry run only
    plans the actions.  ``owner`` is the job's uid where the caller knows it
    (the epilog): it finds the job's channel when the job's state is lost.

    Returns:
        What was done (or, with ``dry_run``, what would be done): one action per object.

    Raises:
        UnsafeNodeError: a daemon survived or the channel could not be removed.
    """
    jd, steps = rt.settings.paths.job(job_id), _Steps(dry_run)
    state = read_state(jd)
    if not dry_run:  # its channel, for a later prolog here while its other trays may hold it (design.md)
        remnants.remember(state, rt)
    # "none": a channel-only job; its directory gone, a daemon /proc misses is its backend's to stop (a unit)
    with_backend = not (state and state.backend == "none") if jd.exists() else _daemon_of(jd, rt) == "unseen"
    if with_backend or daemon.job_processes(rt.host, rt.settings, jd.config, with_clients=True):
        steps.run(Action("stop_daemon", str(job_id)), lambda: _stop_daemon(jd, state, with_backend, rt))
        _step(rt, dry_run, "daemon_stopped")
    chan = _channel_of(job_id, state, rt, owner)
    if chan is not None:
        steps.run(Action("remove_channel", str(chan[0])), lambda: devices.remove_channel(*chan))
        _step(rt, dry_run, "channel_removed")
    if jd.exists():
        steps.run(Action("remove_job_dir", str(jd.path)), lambda: remove_tree(jd.path))
        _step(rt, dry_run, "removed")
    if steps.problems:
        raise UnsafeNodeError("; ".join(steps.problems))
    return tuple(steps.done)


def _step(rt: Runtime, dry_run: bool, name: str) -> None:
    if not dry_run:
        rt.step(name)


def _stop_daemon(jd: JobDir, state: JobState | None, with_backend: bool, rt: Runtime) -> Action:
    """Stop the job's daemon through its backend, then make sure no process of it survives.

    A failed stop is only a problem if a daemon survives: the kill decides.

    Returns:
        The action, with what had to be forced or failed on the way as its
        ``detail`` ('' when the daemon simply stopped), ``killed`` when that was a SIGKILL.

    Raises:
        UnsafeNodeError: a daemon process survives SIGKILL.
    """
    notes, killed_by = [], False
    backend = daemon.make_backend(rt.host, rt.settings, state.backend if state else None)
    if with_backend:
        try:
            forced = backend.stop(jd)
        except (ImexctlError, OSError) as exc:
            notes.append(f"stop failed: {exc}")
        else:
            if forced:
                rt.log.warning("imex.daemon.killed", config=str(jd.config), by=forced)
                notes.append(forced)
                killed_by = "SIGKILL" in forced  # systemd's, after the stop timeout
    try:
        killed = daemon.ensure_gone(rt.host, rt.settings, jd.config)
    except UnsafeNodeError as exc:
        raise UnsafeNodeError("; ".join([*notes, str(exc)])) from exc
    if killed:
        rt.log.warning("imex.daemon.killed", pids=killed, config=str(jd.config))
        notes.append(f"SIGKILL to pid {', '.join(map(str, killed))}")
        # a unit whose daemon imexctl killed is failed now, its own stop notwithstanding: clear it
        left = backend.forget(jd)
        if left:
            notes.append(left)
    else:
        rt.log.info("imex.daemon.stopped", config=str(jd.config))
    return Action("stop_daemon", str(jd.job_id), "; ".join(notes), killed=killed_by or bool(killed))


def _channel_of(job_id: int, state: JobState | None, rt: Runtime, owner: int | None = None) -> tuple[Path, int] | None:
    """The job's channel ``(path, minor)`` if there is one here that may be removed, else None.

    The job's ``state.json`` names it.  Without a readable state (the prolog
    makes the channel only after writing it, so the state was lost since) the
    number cannot be computed from the job id (design.md "The channel rule"):
    with the job's uid (``owner``), the channel is the one node of that uid that
    no other job's state claims; with several, or another job's state
    unreadable too, none is taken, and ``cleanup`` removes strays.
    """
    if state is not None:
        if state.channel_minor is None or not os.path.lexists(state.channel_path):
            return None
        return Path(state.channel_path), state.channel_minor
    if rt.settings.policy.channels != "job" or owner is None:
        return None
    paths = rt.settings.paths
    others = [read_state(paths.job(j)) for j in job_ids(paths.jobs_dir) if j != job_id]
    if any(st is None for st in others):
        return None  # what that job claims is unknown: nothing is taken
    claimed = {0} | {st.channel_minor for st in others if st is not None}
    mine = [c for c in devices.list_channels(paths.channel_dir) if c.uid == owner and c.minor not in claimed]
    return (mine[0].path, mine[0].minor) if len(mine) == 1 else None


def epilog(env: Mapping[str, str], rt: Runtime, job: JobContext | None = None) -> EpilogResult:
    """Tear down this job's domain on this node; safe after a failed or missing prolog.

    ``job`` is the job as the caller already read it from ``env`` (None:
    read here).  A daemon that ended before the job is reported
    (``imex.daemon.lost``); with ``[policy] lost_daemon = drain`` the epilog
    then fails, after the teardown, so that Slurm drains the tray.  Before a
    daemon is stopped, the job user's processes that still hold the NVIDIA
    driver are waited for (``[daemon] process_wait_s``, :func:`_wait_for_processes`).
    """
    t0 = rt.host.monotonic()
    lost: list[str] = []
    busy: list[str] = []
    actions: list[Action] = []
    try:
        job = job or JobContext.from_env(env, need_nodes=False)
        bind(rt, job_id=job.job_id, node=job.node)
        notes.forget(str(rt.settings.paths.run_dir), job.job_id)
        until = t0 + rt.settings.daemon.process_wait_s  # one wait for all the job's domains here
        ids = domains(job)
        for n, jid in enumerate(ids):
            if _left_anything(rt.settings.paths.job(jid), rt):
                # first: even a lock timeout leaves it for cleanup; with the deadline of the waits to come
                _mark_ended(rt.settings.paths.job(jid), rt, until, len(ids) - n)
                busy += _wait_for_processes(jid, rt, until)  # without the lock: nothing of the tray changes
                with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.daemon.lock_timeout_s):
                    rt.step("locked")
                    lost += _lost_daemon(jid, rt)
                    actions += teardown(jid, rt, owner=job.uid)
        if lost and rt.settings.policy.lost_daemon == "drain":
            raise DaemonLostError(
                f"{'; '.join(lost)}; [policy] lost_daemon = drain: the tray is clean, see why the daemon "
                f"ended ([paths] imex_log_file, journalctl -u {rt.settings.daemon.unit}@<job>), then resume it",
                len(lost),
            )
    except ImexctlError as exc:
        log_failed("epilog.done", exc, rt, t0)
        if job is not None:  # the node is drained with its own reason, not "Epilog error" (slurm.drain)
            text = drain.reason(exc.code, job.node, str(exc), job=job.job_id)
            drain.leave(rt.host, rt.settings, rt.log, node=job.node, slurm_conf=job.slurm_conf, text=text)
        raise
    return _epilog_done(rt, t0, tuple(actions), tuple(lost), tuple(busy))


def _wait_for_processes(job_id: int, rt: Runtime, until: float) -> list[str]:
    """Wait, until ``until``, for the job user's processes that hold the NVIDIA driver; say so if some remain.

    When ``nvidia-imex`` exits while a process still holds memory imported
    through it, the driver kills that process and, with exports left, refuses
    new fabric allocations on the tray until a daemon starts again (design.md
    source imex-abrupt-shutdown).  slurmd runs the epilog once every step of
    the job has ended (design.md source slurm-epilog-order), so what can remain
    is what Slurm could not end or does not track: a process stuck in the
    driver, or one started outside the job's steps.  A process can hold
    imported memory only as a client of the driver, so those are the ones
    counted: processes of the job's user (the tray was the job's alone) with a
    ``/dev/nvidia*`` file open.  Only a domain whose daemon still runs is
    waited for, by the one rule (``daemon.daemon_runs``: a daemon that
    ``/proc`` misses but its backend says runs, or whose backend cannot be
    asked, is waited for too); a job of root's is not (root's own daemons
    hold the driver).

    Returns:
        ``["the IMEX daemon of job N is stopped while ..."]`` when processes remain, else [].
    """
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    if state is None or state.backend == "none" or state.uid == 0:
        return []
    if daemon.daemon_runs(rt.host, rt.settings, jd, state.backend) is False:
        return []  # no daemon to stop: the driver has dealt with its clients already
    t0, pause = rt.host.monotonic(), 0.05
    while True:
        try:
            left = rt.host.driver_clients(state.uid)
        except ImexctlError:  # /proc cannot be listed: nothing seen to wait for (teardown reports /proc)
            return []
        now = rt.host.monotonic()
        if not left or now >= until:
            break
        rt.host.sleep(min(pause, until - now))
        pause = min(2 * pause, 1.0)
    if not left:
        return []
    pids = sorted(p.pid for p in left)
    rt.log.warning("imex.daemon.stop_busy", domain_job_id=job_id, uid=state.uid, pids=pids, waited_s=round(now - t0, 3))
    why = (
        f"the IMEX daemon of job {job_id} is stopped while pid {', '.join(map(str, pids))} of uid {state.uid} "
        f"still hold the NVIDIA driver (after {now - t0:.1f}s of [daemon] process_wait_s)"
    )
    return [why]


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


def idle_epilog(job: JobContext, rt: Runtime) -> EpilogResult | None:
    """The whole epilog of a job that left nothing here; None (nothing logged) when the full epilog must run.

    Most jobs never had a domain on a tray.  ``cli`` runs this first, with a
    ``log.LineLogger``, so that their epilog never imports psutil
    (docs/performance.md).  The decision is ``gate.nothing_left``, the
    fast path's, with the full epilog's checks.
    """
    t0 = rt.host.monotonic()
    try:
        if not nothing_left(job, rt.settings.node_paths, lambda jid: _left_anything(rt.settings.paths.job(jid), rt)):
            return None
    except (ImexctlError, OSError):
        return None
    bind(rt, job_id=job.job_id, node=job.node)
    return _epilog_done(rt, t0)


def _epilog_done(
    rt: Runtime, t0: float, actions: tuple[Action, ...] = (), lost: tuple[str, ...] = (), busy: tuple[str, ...] = ()
) -> EpilogResult:
    result = EpilogResult(round(rt.host.monotonic() - t0, 3), actions, lost, busy_stop=busy)
    rt.log.info("epilog.done", **result.fields())
    return result


def _mark_ended(jd: JobDir, rt: Runtime, until: float, domains_left: int) -> None:
    """Record in the job's state that its epilog runs here, so ``cleanup`` knows the job has ended.

    With the mark goes the epilog's own deadline: every wait it makes from
    here on, with the settings it read (``jobs.epilog_waits``): what is left
    of its wait for the job's processes (until ``until``, the host's
    monotonic clock), and for each of its ``domains_left`` (this one and
    those after it) the lock, the stop and the kill.  Until then ``health``
    and ``doctor`` take the job's leftovers for an epilog in flight
    (``jobs.epilog_pending``).

    Written before the node lock is taken, so an epilog that times out on the
    lock still leaves its job to plain ``cleanup``.  Without the lock it may
    race a prolog of the same job, which slurmd never runs at the same time
    (design.md source slurm-prolog-order); a lost mark only makes ``cleanup``
    more careful.  It may also race a ``cleanup`` or another job's claim that
    holds the lock and removes this very directory: ``fsutil.remove_tree``
    empties it again when the mark's file lands meanwhile, and the mark's own
    write then fails, which is fine here.  Best effort: if the state cannot be
    written, teardown (which removes it) reports the problem.
    """
    now, d = rt.host.time(), rt.settings.daemon
    waits = epilog_waits(d, max(0.0, until - rt.host.monotonic()), domains_left)
    try:
        mark_state(jd, ended=now, deadline=now + waits)
    except OSError:
        pass


def _left_anything(jd: JobDir, rt: Runtime) -> bool:
    """``gate.left_anything`` as the full epilog looks: the job's directory, or a daemon of it by the one rule."""
    return left_anything(str(jd.path), str(jd.config), has_process=lambda _config: bool(_daemon_of(jd, rt)))


def _daemon_of(jd: JobDir, rt: Runtime) -> str:
    """Whether a daemon of the job runs here, by the one rule (``daemon.daemon_runs``): ``seen``, ``unseen`` or ''.

    ``seen``: the host's scan finds it (or its ``nvidia-imex-ctl`` client);
    ``unseen``: a process of root's names the job's config, the scan does not
    take it for the daemon (its program moved under it), and the backend
    (the configured one: this is for a job without its directory) says it
    runs or cannot be asked.  A daemon and its client name the config, so
    where no process of root's does, none runs and no backend is asked: an
    idle epilog costs the one scan it always did.
    """
    if not rt.host.processes_with_arg(str(jd.config), uids={0, rt.host.euid()}):  # a daemon's owners
        return ""
    if daemon.job_processes(rt.host, rt.settings, jd.config, with_clients=True):
        return "seen"
    return "" if daemon.daemon_runs(rt.host, rt.settings, jd, found=[]) is False else "unseen"


def cleanup(rt: Runtime, *, job_id: int | None = None, dry_run: bool = False, force: bool = False) -> CleanupResult:
    """Reset the node after failed jobs: tear down every job no longer running here.

    Which jobs may still run is decided locally (slurmctld is never asked), see
    ``jobs.still_runs``.  ``force`` tears down running jobs too.  Stray channels
    (not channel0) are removed when imexctl owns channels, none while a job it
    leaves has a state that cannot be read (``skipped`` says so).
    """
    actions: list[Action] = []
    skipped: list[str] = []
    errors: list[str] = []
    planned: set[Path] = set()  # channels that teardown removes: a dry run must not name them twice
    torn: set[int] = set()  # jobs torn down (or, dry, to be): what their states claim no longer runs
    with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.daemon.lock_timeout_s):
        rt.step("locked")
        for jid in [job_id] if job_id is not None else known_jobs(rt):
            live = GONE if force else still_runs(jid, rt)
            if live.runs:
                skipped.append(f"job {jid} {live.why} (use --force)")
                continue
            chan = _channel_of(jid, read_state(rt.settings.paths.job(jid)), rt)
            planned |= {chan[0]} if chan else set()
            torn.add(jid)
            try:
                actions += teardown(jid, rt, dry_run=dry_run)
            except UnsafeNodeError as exc:
                errors.append(str(exc))
        if job_id is None and rt.settings.policy.channels == "job":
            strays, held = _remove_stray_channels(rt, dry_run, planned, torn)
            actions += strays
            skipped += [held] if held else []
        actions += _remove_notes(rt, job_id, dry_run, force)
    report = CleanupResult(dry_run, tuple(actions), tuple(skipped), tuple(errors))
    rt.log.info("cleanup.done", **report.data())
    if errors:
        raise UnsafeNodeError("; ".join(errors))
    return report


def _remove_notes(rt: Runtime, job_id: int | None, dry_run: bool, force: bool) -> list[Action]:
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
        if dry_run or notes.forget(str(rt.settings.paths.run_dir), jid):
            out.append(Action("remove_note", str(jid)))
    return out


def _remove_stray_channels(rt: Runtime, dry_run: bool, planned: set[Path], torn: set[int]) -> tuple[list[Action], str]:
    """Remove channel nodes that no job claims (not channel0), except those that teardown removes already.

    A job whose state cannot be read may claim any channel but channel0, so
    while one that is not torn down (``torn``: it may still run) has such a
    state, no stray is removed, as the epilog takes no channel then
    (:func:`_channel_of`).

    Returns:
        What was done (or would be), and why strays were left ('' when none was).
    """
    paths = rt.settings.paths
    states = {j: read_state(paths.job(j)) for j in job_ids(paths.jobs_dir)}
    claimed = {st.channel_minor for st in states.values() if st is not None}
    strays = [
        c
        for c in devices.list_channels(paths.channel_dir)
        if c.minor != 0 and c.minor not in claimed and c.path not in planned
    ]
    unread = [j for j, st in states.items() if st is None and j not in torn]
    if strays and unread:
        names, who = ", ".join(c.path.name for c in strays), ", ".join(map(str, unread))
        return [], f"no stray channel removed ({names}): the state of job {who} cannot be read, and it may claim any"
    out = []
    for chan in strays:
        try:
            if not dry_run:
                devices.remove_channel(chan.path, chan.minor)
            out.append(Action("remove_stray_channel", str(chan.path)))
        except DeviceError as exc:
            out.append(Action("failed", str(chan.path), str(exc)))
    return out, ""
