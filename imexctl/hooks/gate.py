"""The prolog's policy gate and summary line: light enough to run before anything heavy is imported.

Most prologs on a shared cluster are for jobs the policy skips, and each one
sits on the job's start.  ``cli`` runs :func:`skipped_prolog` first, with a
``log.LineLogger``: when the policy skips the job, the prolog ends here
without importing structlog, tenacity, psutil or pynvml (docs/performance.md).
The full prolog (``prolog.py``) uses the same gate and the same summary.
"""

from __future__ import annotations

from imexctl.slurm.job import JobContext, constraint_features

# typing is not imported at run time: imexctl.hooks.quick imports policy_skip (docs/performance.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from imexctl.hooks.runtime import Runtime

__all__ = ["policy_skip", "prolog_done", "shared_reason", "skipped_prolog", "tell_user", "told_field"]


def policy_skip(job: JobContext, policy: Mapping[str, Any]) -> str:
    """Why this job gets no IMEX by ``[policy]`` ('' when it does): the one place this is decided.

    ``policy`` holds the section's values by key (``jobs``, ``partitions``,
    ``feature``, ``shared``), as the fast path reads them or as ``vars()`` of
    :class:`imexctl.config.settings.Policy` gives them.  A job that may share
    its trays is skipped with ``shared = skip``; with ``shared = refuse`` it is
    not skipped here, and the prolog refuses it (:func:`shared_reason`).
    """
    jobs = policy["jobs"]
    if jobs == "partitions" and job.partition not in policy["partitions"]:
        return f"partition {job.partition or '?'} is not in [policy] partitions"
    if jobs == "feature" and policy["feature"] not in constraint_features(job.constraints):
        return f"job did not request feature {policy['feature']!r} (--constraint)"
    return shared_reason(job) if policy["shared"] == "skip" else ""


def shared_reason(job: JobContext) -> str:
    """Why a job that may share its trays gets no IMEX ('' for a job that has its trays to itself)."""
    if not job.is_shared:
        return ""
    return (
        f"the job may share its trays with other jobs ({job.sharing}); an IMEX domain needs whole trays: "
        "submit with --exclusive, or to a partition with OverSubscribe=EXCLUSIVE"
    )


def tell_user(job: JobContext, reason: str, run_dir: str, proc_devices: str) -> bool:
    """Leave the job a note that it runs without IMEX, for the TaskProlog (``notes``); True when left.

    Only a job that could have had IMEX by asking (one that may share its
    trays) is told: a job that the site's policy leaves out is not.

    Raises:
        OSError: the note cannot be written safely (the caller logs it; never a reason to fail).
    """
    if not reason or reason != shared_reason(job):
        return False
    from imexctl.channels import notes

    return notes.leave(run_dir, proc_devices, job.job_id, f"IMEX was not set up for job {job.job_id}: {reason}")


def prolog_done(rt: Runtime, t0: float, *, skipped: str = "", **summary: Any) -> dict[str, Any]:
    """Log the prolog's summary (``imex.skipped`` first for a skipped job) and return it."""
    out = {"ok": True, **summary, "duration_s": round(rt.host.monotonic() - t0, 3)}
    if skipped:
        rt.log.info("imex.skipped", reason=skipped)
        out["skipped"] = skipped
    rt.log.info("prolog.done", **out)
    return out


def skipped_prolog(env: Mapping[str, str], rt: Runtime) -> dict[str, Any] | None:
    """The whole prolog of a job that the policy skips; None (nothing logged) when the full prolog must run.

    The full prolog also runs when the job's environment is invalid: it
    reports that, as it always does.
    """
    from imexctl.hooks.runtime import bind
    from imexctl.platform.errors import ImexctlError

    t0 = rt.host.monotonic()
    try:
        job = JobContext.from_env(env, need_nodes=True)
    except ImexctlError:
        return None
    skip = policy_skip(job, vars(rt.settings.policy))
    if not skip:
        return None
    bind(rt, job_id=job.job_id, node=job.node)
    paths = rt.settings.paths
    try:
        told = tell_user(job, skip, str(paths.run_dir), str(paths.proc_devices))
    except OSError:
        return None  # the full prolog reports it
    return prolog_done(rt, t0, skipped=skip, **told_field(told))


def told_field(told: bool) -> dict[str, Any]:
    """The summary's ``told_user`` field, present only when a note was left."""
    return {"told_user": True} if told else {}
