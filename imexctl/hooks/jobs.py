"""Which jobs this node holds, and whether each may still run here: decided on the tray, never by slurmctld.

``status``, ``doctor``, ``cleanup`` and the prolog's claim ask these
questions; the teardown that follows is ``teardown``'s.
"""

from __future__ import annotations

import os

from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import job_ids, read_state
from imexctl.imex import daemon
from imexctl.platform.host import ProcInfo

__all__ = ["known_jobs", "scan_jobs", "still_runs"]


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
