"""Which jobs this node holds, and whether each may still run here: a typed answer (:class:`Liveness`).

Decided on the tray (:func:`still_runs`: ``status``, ``doctor``, ``health``,
``cleanup``); the prolog's claim alone asks slurmctld when the tray is in
doubt, in the one place that does (:func:`still_runs_here`).  The teardown
that follows is ``teardown``'s.
"""

from __future__ import annotations

import os

from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import JobState, job_ids, read_state
from imexctl.imex import daemon
from imexctl.platform import Record
from imexctl.platform.errors import ImexctlError
from imexctl.platform.host import ProcInfo
from imexctl.slurm import nodefold

TYPE_CHECKING = False
if TYPE_CHECKING:
    from imexctl.config.settings import Daemon
    from imexctl.slurm.slurmctld import JobRecord

__all__ = [
    "CLOCK_SLACK_S",
    "GONE",
    "Liveness",
    "daemon_left",
    "epilog_pending",
    "epilog_waits",
    "known_jobs",
    "not_here",
    "other_run",
    "scan_jobs",
    "still_runs",
    "still_runs_here",
]


class Liveness(Record):
    """Whether a job may still run on this node (:func:`still_runs`), and why.

    Ask ``runs``: the record itself has no truth value (a tuple is always
    true, so ``if still_runs(...)`` would keep every job).
    """

    #: the job may still run here: its domain must be left alone
    runs: bool
    #: a slurmstepd or a cgroup of the job shows it runs: no answer of slurmctld changes that
    seen: bool = False
    #: why it may still run, for the admin; for a job that does not, what showed it, where known ('' else)
    why: str = ""

    def __bool__(self) -> bool:
        raise TypeError("Liveness has no truth value: ask its runs")


#: the job surely does not run on this node
GONE = Liveness(False)

_SET_UP = "its domain is set up and its epilog has not run here"
_NO_STEP = "and a job has no slurmstepd or cgroup on a node before its first step there"


def still_runs(job_id: int, rt: Runtime) -> Liveness:
    """Whether job ``job_id`` may still run on this node, decided on the tray.

    A slurmstepd or a cgroup of the job proves it runs.  Their absence does not
    prove the opposite: a job has neither on a node before its first step
    there, which with ``PrologFlags=Alloc`` (without ``Contain``) can be the
    whole job, and even ``Contain`` starts the extern step only after the
    prolog (design.md source slurm-prolog-order).  So a job whose prolog set up
    its domain, which is still there, and whose epilog has not run here, counts
    as running too: when in doubt, leave it.  Whether its daemon is still there
    is :func:`imexctl.imex.daemon.daemon_runs`'s rule, and a backend that
    cannot be asked counts as a daemon that runs.
    """
    if rt.host.job_is_running(job_id):
        return Liveness(True, True, "still runs on this node")
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    if state is None or not state.set_up or state.ended:
        return GONE
    if state.backend == "none":
        if not (state.channel_path and os.path.lexists(state.channel_path)):
            return GONE
        return Liveness(True, why=f"may still run on this node: {_SET_UP}, {_NO_STEP}")
    runs = daemon.daemon_runs(rt.host, rt.settings, jd, state.backend)
    if runs is False:
        return GONE
    if runs is None:
        unknown = f"and whether its daemon runs is unknown (the {state.backend} backend cannot be asked)"
        return Liveness(True, why=f"may still run on this node: {_SET_UP}, {unknown}")
    return Liveness(True, why=f"may still run on this node: {_SET_UP}, {_NO_STEP}")


def still_runs_here(job_id: int, rt: Runtime, *, node: str, slurm_conf: str) -> Liveness:
    """:func:`still_runs`, and in its doubt slurmctld, asked once and believed only for this tray and this run.

    In doubt: the job may still run by the tray's own evidence but no
    slurmstepd or cgroup shows it (``seen``).  Then slurmctld's record
    (``squeue``, only under slurmd: ``slurm_conf`` set) decides: a job it
    reports ended, requeued or pending, running on other trays only
    (requeued after a node failure), or in another run than the one that left
    the domain (requeued, or its id reused after a state reset) no longer runs
    here (:func:`not_here`); the answer says what slurmctld said (``why``).  No
    answer keeps the job.
    """
    live = still_runs(job_id, rt)
    if not live.runs or live.seen or not slurm_conf:
        return live
    from imexctl.platform.errors import SlurmQueryError
    from imexctl.slurm import slurmctld

    found = slurmctld.job_record(job_id, rt.host, rt.settings, slurm_conf)
    if found is None:
        return live
    trays = found.trays
    if found.het_job_id == job_id and found.wants_to_start:  # a joint het domain spans every component's trays
        try:
            trays = tuple(n for _, n in slurmctld.het_nodes(job_id, rt.host, rt.settings, slurm_conf))
        except SlurmQueryError:
            return live
    gone = not_here(found._replace(trays=trays), read_state(rt.settings.paths.job(job_id)), node)
    return Liveness(False, why=gone) if gone else live


def daemon_left(job_id: int, rt: Runtime, state: JobState | None) -> str:
    """The daemon of job ``job_id`` that runs here by the one rule (:func:`imexctl.imex.daemon.daemon_runs`), named.

    ``daemon pid 4001`` when ``/proc`` shows it; else, when the job's backend
    (``state``'s, the configured one without a state) says it runs though the
    scan misses it (its program moved under it), what that backend knows:
    ``daemon (unit imexctl-imex@7.service, pid 4001: its systemd backend says
    it runs, ...)``.  '' when none runs, or the backend cannot be asked: no
    daemon is claimed then.
    """
    jd = rt.settings.paths.job(job_id)
    procs = daemon.job_processes(rt.host, rt.settings, jd.config)
    if procs:
        return f"daemon pid {', '.join(str(p.pid) for p in procs)}"
    name = state.backend if state is not None else rt.settings.daemon.backend
    if name == "none" or daemon.daemon_runs(rt.host, rt.settings, jd, name, found=procs) is not True:
        return ""
    try:  # what the backend knows of it, for the admin
        info = daemon.make_backend(rt.host, rt.settings, name).info(jd)
        known = ", ".join([*([f"unit {info.unit}"] if info.unit else []), *([f"pid {info.pid}"] if info.pid else [])])
    except (ImexctlError, OSError):
        known = ""
    seen = f"its {name} backend says it runs, /proc does not show it as [commands] nvidia_imex"
    return f"daemon ({known}: {seen})" if known else f"daemon ({seen})"


def epilog_pending(job_id: int, rt: Runtime) -> bool:
    """Whether the job's epilog began here and may still be working: its leftovers are no fault yet.

    The epilog marks the job ``ended`` *before* it waits for the job's
    processes and takes the node lock (``teardown._mark_ended``), so for a
    while, without the lock held, a job can look ended with its daemon alive.
    With the mark it records its own deadline (``epilog_deadline``: every wait
    it makes from there on, with the settings it read, :func:`epilog_waits`);
    until then what it left is no fault (``imexctl health``, ``imexctl
    doctor``).  A state an older version marked has no deadline: then every
    wait of today's settings counts from the mark, as one domain's.  The
    clock is the tray's (``host.time``), as the mark's.
    """
    state = read_state(rt.settings.paths.job(job_id))
    if state is None or not state.ended:
        return False
    d = rt.settings.daemon
    deadline = state.epilog_deadline or state.ended + epilog_waits(d, d.process_wait_s)
    return rt.host.time() < deadline


def epilog_waits(d: Daemon, process_wait_s: float, domains: int = 1) -> float:
    """The longest an epilog works from its mark on, in seconds, by its settings ``d``.

    It waits for the job's processes that hold the driver (``process_wait_s``:
    what is left of ``[daemon] process_wait_s``, which counts from the
    epilog's start once for all the job's domains), then for each of its
    ``domains`` left on the tray (the job's own and its het job's): for the
    node lock (``lock_timeout_s``), for the daemon's stop (``stop_timeout_s``)
    and its SIGKILL grace (``kill_grace_s``), and its other steps
    (:data:`_EPILOG_SLACK_S`).
    """
    return process_wait_s + domains * (d.lock_timeout_s + d.stop_timeout_s + d.kill_grace_s + _EPILOG_SLACK_S)


#: what an epilog may take beyond its waits for each domain: its start-up and its other steps
_EPILOG_SLACK_S = 10.0


#: how far slurmctld's clock and a tray's may be apart: munge refuses a credential older than its time to
#: live (300 s by default), so Slurm itself stops working beyond that
CLOCK_SLACK_S = 300


def other_run(state: JobState, restarts: int | None, start_time: int | None) -> str:
    """Why ``state`` was left by another run of its job than the one with this restart count and start time.

    '' when it may be the same run.  The restart count (how often the job was
    requeued) and the start time are slurmctld's, as slurmd gave them to the
    prolog that wrote ``state`` (``restarts``, ``start_time``) and as they are
    now.  Without the start a prolog recorded, the state's ``created`` (this
    tray's clock) stands for it: a run that started later than that, beyond
    :data:`CLOCK_SLACK_S`, is another (requeued, or the id reused after
    slurmctld lost its state).  Unknown values decide nothing.
    """
    if state.restarts is not None and restarts is not None and state.restarts != restarts:
        return f"another run: restart count {restarts}, the leftovers' {state.restarts}"
    if start_time is None:
        return ""
    since = state.start_time if state.start_time is not None else state.created + CLOCK_SLACK_S
    if start_time > since:
        return f"another run: it started at {start_time}, after the leftovers were made ({int(state.created)})"
    return ""


def not_here(found: JobRecord, state: JobState | None, node: str) -> str:
    """Why slurmctld's record ``found`` shows that what its job left on ``node`` is no live domain; '' if it may be.

    slurmctld's RUNNING is true of the job, not of this tray: a job requeued
    after a node failure runs on other trays now, and a job id reused after a
    state reset names another job.  The leftovers are live only when the job
    still wants to run, its node list holds this tray and it is the run that
    left them (:func:`other_run`).
    """
    if not found.wants_to_start:
        return f"slurmctld says {found.state}"
    if not found.holds(node):
        where = nodefold.fold(list(found.trays)) if found.trays else "no node"
        return f"slurmctld says it runs on {where}, not on this tray"
    return other_run(state, found.restarts, found.start_time) if state is not None else ""


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
