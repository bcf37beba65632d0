"""The prolog's policy gate and summary line: light enough to run before anything heavy is imported.

Most prologs on a shared cluster are for jobs the policy skips, and each one
sits on the job's start.  ``cli`` runs :func:`skipped_prolog` first, with a
``log.LineLogger``: when the policy skips the job, the prolog ends here
without importing structlog, tenacity, psutil or pynvml (docs/performance.md).
The full prolog (``prolog.py``) uses the same gate and the same summary.
"""

from __future__ import annotations

from imexctl.slurm import JobContext, constraint_features

# typing is not imported at run time: imexctl.quick imports policy_skip (docs/performance.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from imexctl.runtime import Runtime

__all__ = ["policy_skip", "prolog_done", "skipped_prolog"]


def policy_skip(job: JobContext, *, jobs: str, partitions: tuple[str, ...], feature: str) -> str:
    """Why this job gets no IMEX by ``[policy]`` ``jobs``, ``partitions`` and ``feature`` ('' when it does)."""
    if jobs == "partitions" and job.partition not in partitions:
        return f"partition {job.partition or '?'} is not in [policy] partitions"
    if jobs == "feature" and feature not in constraint_features(job.constraints):
        return f"job did not request feature {feature!r} (--constraint)"
    return ""


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
    from imexctl.errors import ImexctlError
    from imexctl.runtime import bind

    t0 = rt.host.monotonic()
    try:
        job = JobContext.from_env(env, need_nodes=True)
    except ImexctlError:
        return None
    p = rt.settings.policy
    skip = policy_skip(job, jobs=p.jobs, partitions=p.partitions, feature=p.feature)
    if not skip:
        return None
    bind(rt, job_id=job.job_id, node=job.node)
    return prolog_done(rt, t0, skipped=skip)
