"""The hooks' gates: whether a prolog is skipped, whether an epilog has anything to do.

Each decision is written once, here, and light enough to run before anything
heavy is imported.  Every tier hands them the same light typed records
(:mod:`imexctl.config.schema`: ``Policy``, ``NodePaths``): the fast tier
(``entry.first``) the ones it built from the plain config file, the settings tier
(``entry.run``) and the full hooks (``prolog``, ``teardown``) the settings' own, with
their host.  Most prologs
on a shared cluster are for jobs the policy skips, most epilogs for jobs that
left nothing on the tray; each sits on a job's start or end
(docs/performance.md).  The fields of the summary lines that end a hook
(``prolog.done``, ``epilog.done``, a skip) are written here too, in their
order, for the fast tier, which writes them itself, and for the records of
:mod:`imexctl.hooks.results`.
"""

from __future__ import annotations

import os

from imexctl.slurm.job import SHARING_UNKNOWN, JobContext, constraint_features

# typing is not imported at run time: imexctl.hooks.entry's fast tier imports this module (docs/performance.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Callable

    from imexctl.config.schema import NodePaths, Policy

    #: one log line: its event and its fields, in order
    Line = tuple[str, dict[str, object]]

__all__ = [
    "Skip",
    "domains",
    "epilog_fields",
    "left_anything",
    "nothing_left",
    "policy_skip",
    "prolog_fields",
    "shared_reason",
    "skipped_lines",
    "skipped_prolog",
    "tell_user",
]


class Skip:
    """Why ``[policy]`` skips a job, whether its user was told (``told``), and why the note failed ('' when not).

    A frozen record, without ``dataclasses`` (start-up cost), like :class:`imexctl.slurm.job.JobContext`.
    """

    __slots__ = ("problem", "reason", "told")

    reason: str
    told: bool
    problem: str

    def __init__(self, reason: str, told: bool = False, problem: str = "") -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "told", told)
        object.__setattr__(self, "problem", problem)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Skip is frozen: cannot set {name}")

    def _values(self) -> tuple[str, bool, str]:
        return (self.reason, self.told, self.problem)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Skip) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"Skip(reason={self.reason!r}, told={self.told!r}, problem={self.problem!r})"


def skipped_prolog(job: JobContext, policy: Policy, paths: NodePaths) -> Skip | None:
    """Whether ``[policy]`` skips this job (None when it does not): the one place the prolog decides it.

    A skipped job that could have had IMEX by asking is left its note first
    (:func:`tell_user`); a note that cannot be written is no reason to fail,
    and comes back as ``problem`` (the fast path then leaves the run to the
    full prolog, which logs ``imex.note_failed``).
    """
    reason = policy_skip(job, policy)
    if not reason:
        return None
    try:
        told = tell_user(job, reason, paths)
    except OSError as exc:
        return Skip(reason, problem=f"{exc.filename or paths.run_dir}: {exc.strerror or exc}")
    return Skip(reason, told)


def policy_skip(job: JobContext, policy: Policy) -> str:
    """Why this job gets no IMEX by ``[policy]`` ('' when it does).

    A job that may share its trays is skipped with ``shared = skip``; with
    ``shared = refuse`` it is not skipped here, and the prolog refuses it
    (:func:`shared_reason`).  A job that slurmctld did not say about (Slurm
    22.05, no answer) is skipped either way: its trays are drained for no
    fault of theirs and no request of the job's.
    """
    if policy.jobs == "partitions" and job.partition not in policy.partitions:
        return f"partition {job.partition or '?'} is not in [policy] partitions"
    if policy.jobs == "feature" and policy.feature not in constraint_features(job.constraints):
        return f"job did not request feature {policy.feature!r} (--constraint)"
    return shared_reason(job) if policy.shared == "skip" or job.sharing_from == SHARING_UNKNOWN else ""


def shared_reason(job: JobContext) -> str:
    """Why a job that may share its trays gets no IMEX ('' for a job that has its trays to itself)."""
    if not job.is_shared:
        return ""
    if job.sharing_from == SHARING_UNKNOWN:
        return (
            f"the job may share its trays with other jobs as far as imexctl knows ({job.sharing}); an IMEX "
            "domain needs whole trays: run the job again, or ask the site's administrators"
        )
    return (
        f"the job may share its trays with other jobs ({job.sharing}); an IMEX domain needs whole trays: "
        "submit with --exclusive, or to a partition with OverSubscribe=EXCLUSIVE"
    )


def tell_user(job: JobContext, reason: str, paths: NodePaths) -> bool:
    """Leave the job a note that it runs without IMEX, for the TaskProlog (``notes``); True when left.

    Only a job that could have had IMEX by asking (one that may share its
    trays) is told: a job that the site's policy leaves out is not.

    Raises:
        OSError: the note cannot be written safely (the caller logs it; never a reason to fail).
    """
    if not reason or reason != shared_reason(job):
        return False
    from imexctl.channels import notes

    text = f"IMEX was not set up for job {job.job_id}: {reason}"
    return notes.leave(paths.run_dir, paths.proc_devices, job.job_id, text)


def domains(job: JobContext) -> list[int]:
    """The job ids whose domain this job's epilog tears down: its own, and its het job's (keyed by the het job id)."""
    return list(dict.fromkeys([job.job_id, *([job.het_job_id] if job.het_job_id else [])]))


def left_anything(job_dir: str, config: str, *, has_process: Callable[[str], bool]) -> bool:
    """Whether a job left anything on this tray: its directory, or a process naming its config.

    The one rule, for the fast path and the full epilog; each looks its own
    way: the fast path reads ``/proc`` without psutil (a superset: when unsure,
    the full epilog runs), the full epilog asks its host for IMEX processes.
    A channel node alone is nothing the job left: the prolog makes it after the
    job's ``state.json`` and teardown removes it before the job's directory, and
    its number names no job (design.md "The channel rule"), so a node without a
    directory is a stray, which ``cleanup`` removes.
    """
    return os.path.lexists(job_dir) or has_process(config)


def nothing_left(job: JobContext, paths: NodePaths, left: Callable[[int], bool]) -> bool:
    """Remove the job's note (``notes``), then whether neither the job nor its het job left anything here.

    ``left(job_id)`` is :func:`left_anything` for one domain.  Most jobs never
    had a domain on a tray: their epilog takes no lock, so it never waits for
    another job's prolog.
    """
    from imexctl.channels import notes

    notes.forget(paths.run_dir, job.job_id)  # before anything else, as the full epilog does
    return not any(left(jid) for jid in domains(job))


# ---- the fields of the summary lines, in their order


def prolog_fields(
    duration_s: float, *, skipped: str = "", told_user: bool = False, **summary: object
) -> dict[str, object]:
    """The fields of ``prolog.done``, in their order: ``ok``, the summary, ``duration_s``, then ``skipped``."""
    out: dict[str, object] = {"ok": True, **({"told_user": True} if told_user else {}), **summary}
    out["duration_s"] = duration_s
    if skipped:
        out["skipped"] = skipped
    return out


def skipped_lines(reason: str, told: bool, duration_s: float) -> list[Line]:
    """The lines of a prolog that skips its job: ``imex.skipped``, then ``prolog.done``."""
    return [
        ("imex.skipped", {"reason": reason}),
        ("prolog.done", prolog_fields(duration_s, skipped=reason, told_user=told)),
    ]


def epilog_fields(
    actions: Sequence[str], duration_s: float, lost: Sequence[str] = (), busy: Sequence[str] = ()
) -> dict[str, object]:
    """The fields of ``epilog.done``: ``ok``, ``actions``, ``duration_s``, then ``lost_daemon`` and ``busy_stop``.

    ``lost_daemon`` when a daemon was lost, ``busy_stop`` when one was stopped while the job's processes still
    held the NVIDIA driver.
    """
    out: dict[str, object] = {"ok": True, "actions": list(actions), "duration_s": duration_s}
    if lost:
        out["lost_daemon"] = list(lost)
    if busy:
        out["busy_stop"] = list(busy)
    return out
