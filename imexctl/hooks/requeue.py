"""Whether a prolog whose domain never formed may exit 0: what slurmctld says about its job, asked before it fails.

Every tray asks before a ``not_ready`` failure drains it (``[slurm]
check_cancelled``), whoever it thinks is at fault, but the two kinds of
tray ask different questions (docs/design.md "Jobs that Slurm ends,
splits or restarts"):

- **A tray sure of its own fault** (``own_fault``: its daemon never got
  READY, or the verdict says the fault is its own, ``hooks/verdict.py``)
  asks once whether the job is *over*: cancelled, completed, failed, timed
  out (``JobRecord.over``).  Its evidence cannot tell a blocked port from
  peers that left because the job was cancelled (their epilogs stop their
  daemons, and the others then look as if they formed the domain without
  it: issue 41), so it must not be drained for a job that is over.  A job
  that went back to the queue is no end: another tray's failure requeued
  it, it will run again, and this tray may be broken too, so it fails and
  is drained as before.  It never waits: it asks right after its roll-back
  and before its drain, so its own failure still reaches slurmctld first
  and its peers, which wait longer, see the requeue it causes.
- **A tray whose own daemon got READY** but whose domain did not come up
  is not broken itself, as far as it can tell: a peer is.  If that peer's
  prolog fails, Slurm requeues the job (or cancels it), and this tray
  should exit 0 rather than be drained for the peer's fault: it asks
  whether its run was *taken back* (``left_run``: requeues count, and so
  does a next run of the job, already running again).
  Whether the requeue has landed when this tray asks is a matter of
  timing: all trays reach their deadline together, and the broken tray's
  failure reaches slurmctld only after its own roll-back and its one
  question.  So, where it is safe, a tray asks again over a window
  (issue 32 §3, issue 34 §5).

The window:

- **Where it is safe**: with ``PrologFlags=Alloc,DeferBatch`` (no ``NoHold``)
  slurmctld launches the batch script only once every tray's prolog has
  reported, and never for a job that no longer runs (requeued or cancelled
  meanwhile); ``srun`` and ``salloc`` wait for every prolog too.  A tray that
  stays in its prolog until slurmctld shows the job taken back is therefore
  never the reason the job starts without its domain, and the broken tray's
  report is never the last one (which would let the batch launch go out
  before the same slurmd asks for the requeue: ``_rpc_prolog`` reports the
  prolog's end first, src/slurmd/slurmd/req.c).  Without DeferBatch the batch
  script starts on the first tray as soon as that tray's own prolog ends, so
  a tray asks once, as before.
- **How long**: ``[slurm] timeout_margin_s`` from the first question, and
  never so long that slurmd's hook timeout could cut the roll-back's last
  steps short (a question, the drain's ``scontrol update`` and a second are kept
  free below it).
- **Who waits how long** (``HealthTimeout.unsure``): a tray whose evidence
  could also mean its own fault (it reaches none of its peers, though their
  connections arrive) gives up halfway through the window; a tray sure the
  fault is elsewhere waits it out.  So the tray that is sure of its own
  fault fails at once, a tray in doubt next, and the healthy ones last: each
  can still see the requeue the one before caused.
"""

from __future__ import annotations

from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import HealthTimeout
from imexctl.slurm import nodefold
from imexctl.slurm import slurmctld as slurmctl
from imexctl.slurm.job import JobContext

TYPE_CHECKING = False
if TYPE_CHECKING:
    from imexctl.slurm.slurmctld import JobRecord

__all__ = [
    "FIRST_PAUSE_S",
    "MAX_PAUSE_S",
    "ended_reason",
    "job_gone",
    "job_over",
    "left_run",
    "own_fault",
    "taken_back",
    "window_s",
]

#: the pauses between questions: doubling from the first, at most the second
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 1.0


def own_fault(exc: HealthTimeout) -> bool:
    """Whether the tray's evidence says the fault is its own: its daemon never got READY, or its verdict is ``own``."""
    return not exc.local_ready or exc.isolated


def job_gone(
    rt: Runtime,
    exc: HealthTimeout,
    job: JobContext,
    *,
    elapsed_s: float,
    hook_timeout_s: float | None,
    defer_batch: bool,
) -> str | None:
    """The job's state when the prolog about to fail with ``exc`` may exit 0 instead; None: it fails.

    A tray sure of its own fault asks once whether the job is over
    (:func:`job_over`); any other asks whether it was taken back, over
    :func:`window_s` (:func:`taken_back`).  The arguments after ``job`` are
    :func:`window_s`'s.
    """
    if own_fault(exc):
        return job_over(rt, job)
    window = window_s(rt, exc, elapsed_s=elapsed_s, hook_timeout_s=hook_timeout_s, defer_batch=defer_batch)
    return taken_back(rt, job, window)


def job_over(rt: Runtime, job: JobContext) -> str | None:
    """The job's state, asked once, when slurmctld says it will not run again (``JobRecord.over``); else None.

    None too when slurmctld cannot be asked, does not know the job or
    answers oddly: a broken tray is never let off on a guess.
    """
    found = slurmctl.job_record(job.job_id, rt.host, rt.settings, job.slurm_conf)
    return found.state if found is not None and found.over(job.restarts) else None


def ended_reason(exc: HealthTimeout) -> str:
    """What ``prolog.job_ended`` says the prolog would have failed with.

    A tray sure of its own fault says how the wait ended and no more: its
    peers may have gone away with the job, so its verdict (whose text blames
    its own ports or interfaces) is no finding.
    """
    if not own_fault(exc):
        return str(exc)
    return (
        f"IMEX not ready after {exc.waited_s:.1f}s ({exc.attempts} probes): {exc.last_status}; "
        "the job ended while it waited: its peers may have left with it, so nothing here is blamed on this tray"
    )


def window_s(
    rt: Runtime, exc: HealthTimeout, *, elapsed_s: float, hook_timeout_s: float | None, defer_batch: bool
) -> float:
    """How long this tray keeps asking, from its first question (0: it asks once).

    Args:
        rt: the runtime (settings).
        exc: the failure (``unsure``: the tray's evidence could mean its own fault).
        elapsed_s: how long the prolog has run so far.
        hook_timeout_s: slurmd's time limit for the prolog (None: none set).
        defer_batch: slurm.conf makes slurmctld hold the batch script until every prolog reported.
    """
    if not defer_batch:
        return 0.0
    s = rt.settings.slurm
    full = s.timeout_margin_s
    if hook_timeout_s is not None:  # a last question, the drain and the exit still fit
        full = min(full, hook_timeout_s - elapsed_s - 2 * s.query_timeout_s - 1.0)
    full = max(0.0, full)
    return full / 2 if exc.unsure else full


def taken_back(rt: Runtime, job: JobContext, window: float) -> str | None:
    """What slurmctld says once this run of the job will not go on on this tray; asked until ``window`` ends.

    None when it still may (or cannot be asked) at the last question.  See
    :func:`left_run` for what counts.
    """
    until = rt.host.monotonic() + window
    pause = FIRST_PAUSE_S
    while True:
        found = slurmctl.job_record(job.job_id, rt.host, rt.settings, job.slurm_conf)
        gone = left_run(found, job) if found is not None else ""
        if gone:
            return gone
        left = until - rt.host.monotonic()
        if left <= 0:
            return None
        rt.host.sleep(min(pause, left))
        pause = min(2 * pause, MAX_PAUSE_S)


def left_run(found: JobRecord, job: JobContext) -> str:
    """Why slurmctld's record ``found`` shows that ``job``'s run will not go on on this tray; '' when it may.

    The state, when the job will not run on its allocation (ended, or back in
    the queue: :func:`imexctl.slurm.slurmctld.wants_to_start`).  A job
    requeued while this prolog waited can run again before it asks (another
    tray's failure, or slurmctld declaring a tray whose slurmd never got the
    prolog failed: issue 43): RUNNING or CONFIGURING then names the *next*
    run.  Every requeue counts one more restart first (``restart_cnt++``,
    src/slurmctld/job_mgr.c), so a restart count other than this run's
    (``SLURM_JOB_RESTART_COUNT``) is another run; so is a node list without
    this tray.  Unknown values decide nothing.
    """
    if not found.wants_to_start:
        return found.state
    if job.restarts is not None and found.restarts != job.restarts:
        return f"{found.state} (requeued: restart count {found.restarts}, this run's {job.restarts})"
    if found.trays and not found.holds(job.node):
        return f"{found.state} on {nodefold.fold(list(found.trays))}, not on this tray"
    return ""
