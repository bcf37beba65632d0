"""Whether slurmctld took the job back, for a prolog about to fail because its domain never formed.

A tray whose own daemon got READY but whose domain did not come up is not
broken itself, as far as it can tell: a peer is.  If that peer's prolog
fails, Slurm requeues the job (or cancels it), and this tray should exit 0
rather than be drained for the peer's fault.  Whether the requeue has landed
when this tray asks is a matter of timing: all trays reach their deadline
together, and the broken tray's failure reaches slurmctld only after its own
roll-back.  So, where it is safe, a tray asks again over a window
(issue 32 §3, issue 34 §5):

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

A tray sure of its own fault (``HealthTimeout.local_ready`` false, or
``isolated``) never asks: it fails, whatever became of the job.
"""

from __future__ import annotations

from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import HealthTimeout
from imexctl.slurm import slurmctld as slurmctl

__all__ = ["FIRST_PAUSE_S", "MAX_PAUSE_S", "taken_back", "window_s"]

#: the pauses between questions: doubling from the first, at most the second
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 1.0


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


def taken_back(rt: Runtime, job_id: int, slurm_conf: str, window: float) -> str | None:
    """The job's state, as slurmctld reports it, once it will not run on this allocation; asked until ``window`` ends.

    None when it still wants to start (or cannot be asked) at the last question.
    """
    until = rt.host.monotonic() + window
    pause = FIRST_PAUSE_S
    while True:
        state = slurmctl.job_state(job_id, rt.host, rt.settings, slurm_conf)
        if state is not None and not slurmctl.wants_to_start(state):
            return state
        left = until - rt.host.monotonic()
        if left <= 0:
            return None
        rt.host.sleep(min(pause, left))
        pause = min(2 * pause, MAX_PAUSE_S)
