"""A fake slurmctld for FakeHost: jobs as slurmctld holds them, and ``squeue`` as it prints them.

``squeue`` here works as Slurm's does (SchedMD/slurm src/squeue/, src/slurmctld/job_mgr.c; the same in
22.05, 24.11 and 26.05): ``--jobs=ID`` asks slurmctld for that one id, which answers with the job, with
every component of a het job's leader, with every task of an array's own id (``pack_one_job``);
squeue keeps the records whose job id, array job id or het job id is the one asked, hides ended
jobs unless ``--states=all``, and prints each ``--Format`` field (``Name[:[.]width[suffix]]``, width 20
by default, ``0`` for the whole value, ``.`` to right-justify) followed by its suffix, one line per job.
Start times follow ``SLURM_TIME_FORMAT`` (``%s``: seconds since the epoch; unset: local ISO time).

Every field a job's user writes (name, comment, paths, command) can be printed too, so a test can
see what a format that asked for one would do.  Anything else (an option or field not listed here)
raises ``AssertionError``: the fake refuses what it does not know.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Callable

from imexctl.platform.host import Completed

__all__ = ["SlurmJob", "squeue"]

_PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_ACTIVE = frozenset({"RUNNING", "CONFIGURING", "RESIZING", "SIGNALING", "EXPEDITING", "COMPLETING", "STAGE_OUT",
                     "SUSPENDED", "STOPPED"})  # fmt: skip
_INVALID_ID = "slurm_load_jobs error: Invalid job id specified\n"


@dataclasses.dataclass
class SlurmJob:
    """One job record in slurmctld (an array task or a het job component is a job of its own)."""

    job_id: int
    #: as ``job_state_string()`` prints it: RUNNING, CONFIGURING, PENDING, CANCELLED, ...
    state: str = "RUNNING"
    #: the node list as slurmctld prints it ('' while pending)
    nodes: str = ""
    oversubscribe: str = "NO"
    start_time: int = 1796434004
    restarts: int = 0
    het_job_id: int = 0
    het_job_offset: int = 0
    array_job_id: int = 0
    array_task_id: int | None = None
    # what the job's user writes
    name: str = "job.sh"
    comment: str = ""
    work_dir: str = "/home/alice"
    command: str = "/home/alice/job.sh"
    std_out: str = "/home/alice/slurm-%j.out"
    std_err: str = "/home/alice/slurm-%j.out"
    std_in: str = "/dev/null"
    user: str = "alice"
    partition: str = "gpu"
    reason: str = "None"


def _time(t: int, env: Mapping[str, str]) -> str:
    if not t:
        return "N/A"
    fmt = env.get("SLURM_TIME_FORMAT", "")
    return time.strftime(fmt if fmt and fmt != "standard" else "%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _id_or_na(job: SlurmJob, value: int) -> str:
    return str(value) if job.het_job_id else "N/A"


#: squeue --Format names (case-insensitive) -> the value printed (src/squeue/opts.c fmt_data_job, print.c)
_FIELDS: dict[str, Callable[[SlurmJob, Mapping[str, str]], str]] = {
    "jobid": lambda j, e: str(j.job_id),
    "state": lambda j, e: j.state,
    "nodelist": lambda j, e: j.nodes,
    "oversubscribe": lambda j, e: j.oversubscribe,
    "starttime": lambda j, e: _time(j.start_time, e),
    "restartcnt": lambda j, e: str(j.restarts),
    "hetjobid": lambda j, e: _id_or_na(j, j.het_job_id),
    "hetjoboffset": lambda j, e: _id_or_na(j, j.het_job_offset),
    "arrayjobid": lambda j, e: str(j.array_job_id or j.job_id),
    "name": lambda j, e: j.name,
    "comment": lambda j, e: j.comment,
    "workdir": lambda j, e: j.work_dir,
    "command": lambda j, e: j.command,
    "stdout": lambda j, e: j.std_out,
    "stderr": lambda j, e: j.std_err,
    "stdin": lambda j, e: j.std_in,
    "username": lambda j, e: j.user,
    "partition": lambda j, e: j.partition,
    "reason": lambda j, e: j.reason,
}


def _cell(value: str, width: int, right: bool) -> str:
    """``_print_str`` of src/squeue/print.c: width 0 prints all; otherwise cut to the width and padded."""
    if width <= 0:
        return value
    value = value[:width]
    return value.rjust(width) if right else value.ljust(width)


def _format(spec: str) -> list[tuple[str, int, bool, str]]:
    out = []
    for token in spec.split(","):
        name, colon, rest = token.partition(":")
        right = rest.startswith(".")
        rest = rest[1:] if right else rest
        digits = len(rest) - len(rest.lstrip("0123456789"))
        width = int(rest[:digits]) if colon and digits else 0 if colon else 20
        if name.lower() not in _FIELDS:
            raise AssertionError(f"fake squeue: unknown --Format field {name!r}")
        out.append((name.lower(), width, right, rest[digits:] if colon else ""))
    return out


def _options(argv: Sequence[str]) -> dict[str, str]:
    flags = {"-h": "noheader", "--noheader": "noheader", "-a": "all", "--all": "all", "--local": "local"}
    valued = {
        "-t": "states",
        "--states": "states",
        "-j": "jobs",
        "--jobs": "jobs",
        "-O": "format",
        "--Format": "format",
    }
    opts: dict[str, str] = {}
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if arg in flags:
            opts[flags[arg]] = ""
        elif key in valued and eq:
            opts[valued[key]] = value
        elif arg in valued and args:
            opts[valued[arg]] = args.pop(0)
        else:
            raise AssertionError(f"fake squeue: unexpected argument {arg!r} in {list(argv)}")
    if "jobs" not in opts or "format" not in opts or not opts["jobs"].isdigit():
        raise AssertionError(f"fake squeue: wants --jobs=ID and --Format=...: {list(argv)}")
    return opts


def _loaded(jobs: Mapping[int, SlurmJob], job_id: int) -> list[SlurmJob]:
    """What slurmctld sends for one job id (``pack_one_job``)."""
    job = jobs.get(job_id)
    if job is not None and job.het_job_id == job_id:
        return [j for j in jobs.values() if j.het_job_id == job_id]
    if job is not None and not job.array_job_id:
        return [job]
    return ([job] if job else []) + [j for j in jobs.values() if j.array_job_id == job_id and j is not job]


def _shown(job: SlurmJob, job_id: int, all_states: bool) -> bool:
    """squeue's own filter (``_filter_job``): the id asked about, and without ``--states=all`` no ended job."""
    if job_id not in (job.job_id, job.array_job_id, job.het_job_id):
        return False
    return all_states or job.state in _PENDING or job.state in _ACTIVE


def squeue(jobs: Mapping[int, SlurmJob], argv: Sequence[str], env: Mapping[str, str]) -> Completed:
    """What ``squeue`` prints for ``argv`` (see the module's docstring), from slurmctld's ``jobs``."""
    opts = _options(argv)
    job_id = int(opts["jobs"])
    fields = _format(opts["format"])
    if opts.get("states", "").lower() not in ("", "all"):
        raise AssertionError(f"fake squeue: --states={opts['states']} is not supported")
    loaded = _loaded(jobs, job_id)
    if not loaded:
        return Completed(tuple(argv), 1, "", _INVALID_ID)
    lines = [] if "noheader" in opts else ["".join(_cell(f.upper(), w, r) + s for f, w, r, s in fields)]
    for job in loaded:
        if _shown(job, job_id, opts.get("states", "").lower() == "all"):
            lines.append("".join(_cell(_FIELDS[f](job, env), w, r) + s for f, w, r, s in fields))
    return Completed(tuple(argv), 0, "".join(line + "\n" for line in lines), "")
