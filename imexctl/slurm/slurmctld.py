"""What slurmctld says about a job, read as fields that no user can write (``squeue``, bounded).

A prolog asks only when it must (design.md source slurm-no-commands; every other hook run never asks):

- a prolog about to fail asks whether its job still wants to start: a job
  cancelled while its prologs ran must not drain a healthy node;
- a het job's prolog asks for the other components' nodes, so all components
  that share an NVLink domain get one IMEX domain;
- under Slurm 22.05, whose slurmd does not say, a prolog asks whether its job
  may share its trays (``[slurm] ask_sharing``);
- the prolog's claim asks about a job whose leftovers it found.

How it asks (docs/security.md "What slurmctld says"): ``squeue --noheader --all
--local --states=all --jobs=<id> --Format=JobId:0|,State:0|,...``, one line per
job, every field followed by ``|``.  Each field asked for is written by
slurmctld alone (the job id, its state, node list, ``OverSubscribe``, start
time, restart count, het job id and offset); none of the job's name, comment,
paths, command or other text its user sets is ever printed, so no user text
can stand in for a field.  ``scontrol show job -o`` is not read: it joins every
field with blanks, the user's among them, and a ``Key=`` inside a comment is
indistinguishable from a real one there (src/api/job_info.c).  Why not JSON:
22.05's ``scontrol`` has no ``--json`` and its ``squeue --json`` dumps every
job of the cluster whatever ``--jobs`` says (src/squeue/squeue.c), and 24.11's and
26.05's JSON has no ``OverSubscribe`` word (their ``shared`` list is not
``job_share_string()``).  ``squeue -O`` prints the same here on 22.05, 24.11 and
26.05 (tests/data/slurm/).

slurmctld answers a job id with that job's record, and for a het job's leader
with every component, for an array's own id with every task of the array it
still holds (src/slurmctld/job_mgr.c ``pack_one_job``); ``squeue`` keeps
those whose job id, array job id or het job id is the one asked.  Only the line
of the job asked about is taken (and the components' lines for a het job);
each is checked field by field, and anything unexpected, anywhere in the
answer, is "cannot tell": never a guess.
"""

from __future__ import annotations

from typing import Final

from imexctl import slurm as var
from imexctl.config.settings import Settings
from imexctl.platform import Record
from imexctl.platform.errors import CommandError, NodeListError, SlurmQueryError, shorten
from imexctl.platform.host import Host
from imexctl.slurm import nodelist

__all__ = [
    "ENDED_STATES",
    "FIELDS",
    "OVER_STATES",
    "JobRecord",
    "UnknownJob",
    "ask_job",
    "het_nodes",
    "job_record",
    "job_state",
    "parse_answer",
    "squeue_argv",
    "wants_to_start",
]

#: job states in which the job will not run on the allocation this prolog sets up: it ended, is
#: ending, or went back to the queue (requeued because another node's prolog failed, say)
ENDED_STATES: Final = frozenset(
    {
        "CANCELLED", "COMPLETED", "COMPLETING", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
        "DEADLINE", "OUT_OF_MEMORY", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT",
        "REVOKED",
    }
)  # fmt: skip
#: job states in which the job is over (``job_state_string()``'s base states that end it): it will not run again.
#: A job that went back to the queue shows PENDING, REQUEUED, REQUEUE_HOLD, ..., or COMPLETING while its trays
#: complete, never one of these (src/slurmctld/job_mgr.c ``_job_requeue_op``)
OVER_STATES: Final = frozenset(
    {"CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
#: the squeue ``--Format`` fields asked for, in this order: each one slurmctld's alone (src/squeue/print.c)
FIELDS: Final = ("JobId", "State", "NodeList", "OverSubscribe", "StartTime", "RestartCnt", "HetJobId", "HetJobOffset")
#: printed after every field (a ``:0`` width prints the whole value); no field asked for can hold it
SEPARATOR: Final = "|"
#: start times as seconds since the epoch (strftime %s), not squeue's local-time default
_ENV: Final = {var.TIME_FORMAT: "%s"}
#: what squeue prints for a start time slurmctld does not have (0, INFINITE, NO_VAL; src/common/parse_time.c)
_NO_TIME: Final = frozenset({"N/A", "Unknown", "None"})
_MAX_ID: Final = 2**32 - 1
_STATE_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ_")


#: squeue's whole answer, exit 1, for a job id slurmctld does not hold (``ESLURM_INVALID_JOB_ID``; recorded from
#: 22.05, 24.11 and 26.05 in tests/data/slurm/)
_INVALID_ID: Final = "slurm_load_jobs error: Invalid job id specified\n"


class UnknownJob(SlurmQueryError):
    """slurmctld answered, and holds no record of the job: never submitted, or purged.

    slurmctld purges a job's record only once the job is over, no tray is
    COMPLETING it and ``MinJobAge`` has passed since it ended
    (src/slurmctld/job_mgr.c ``_list_find_job_old``): for a job known to have
    run, every epilog of it has ended.  Only a caller that knows the job ran
    on this cluster may read it so (``hooks/remnants.py``); for any other it
    is "cannot tell", as every :class:`SlurmQueryError`.
    """


class JobRecord(Record):
    """One job as slurmctld reports it, every field written by slurmctld (none by the job's user).

    ``job_record`` returns it for one job id; the prolog and its claim read it
    (the state for "will it still run here", the trays and the start or
    restart count for "is it the same run on this tray").
    """

    job_id: int
    #: ``job_state_string()``: ``RUNNING``, ``CONFIGURING`` (prologs running), ``COMPLETING``, ``PENDING``, ...
    state: str
    #: the job's nodes, expanded, in Slurm's order; () while it has none (pending)
    trays: tuple[str, ...]
    #: ``job_share_string()`` up to 25.11 (``NO``, ``OK``, ``YES``, ``USER``, ``MCS``, ``TOPO``), the same words
    #: 23.02-25.11 put in ``SLURM_JOB_OVERSUBSCRIBE``; 26.05's ``job_oversubscribe_string()`` (``NO``, ``YES``,
    #: ``OK``) says nothing about whole nodes
    oversubscribe: str
    #: when the job (this run of it) started, seconds since the epoch; None when slurmctld has no time
    start_time: int | None
    #: how often the job was requeued (``RestartCnt``); with ``start_time``, which run of the job this is
    restarts: int
    #: a het job's leader id and this component's offset; None for other jobs
    het_job_id: int | None = None
    het_job_offset: int | None = None

    def holds(self, node: str) -> bool:
        """Whether the job's node list names ``node``."""
        return node in self.trays

    @property
    def wants_to_start(self) -> bool:
        """Whether the job may still run on its allocation (:func:`wants_to_start` of its state)."""
        return wants_to_start(self.state)

    def over(self, restarts: int | None) -> bool:
        """Whether the job will not run again: an ending state, or COMPLETING with no requeue since run ``restarts``.

        ``job_state_string()`` prints the COMPLETING flag before the base
        state, so a job that is ending and one that went back to the queue
        while its trays complete (PENDING and COMPLETING) read the same.  Every
        requeue counts one more restart first (``restart_cnt++`` in
        src/slurmctld/job_mgr.c, 22.05 to 26.05), so COMPLETING with the restart
        count this run started with (``SLURM_JOB_RESTART_COUNT``) is an end.
        ``restarts`` None (slurmd did not say): COMPLETING tells nothing.
        """
        if self.state in OVER_STATES:
            return True
        return self.state == "COMPLETING" and restarts is not None and self.restarts == restarts


class _Line(Record):
    """One line of squeue's answer, fields as printed (checked, nodes not yet expanded)."""

    job_id: int
    state: str
    nodes: str
    oversubscribe: str
    start_time: int | None
    restarts: int
    het_job_id: int | None
    het_job_offset: int | None


def squeue_argv(squeue: str, job_id: int) -> tuple[str, ...]:
    """The one command imexctl runs to ask slurmctld about a job: its own record's user-free fields."""
    spec = ",".join(f"{name}:0{SEPARATOR}" for name in FIELDS)
    return (squeue, "--noheader", "--all", "--local", "--states=all", f"--jobs={job_id}", f"--Format={spec}")


def wants_to_start(state: str) -> bool:
    """Whether a job in ``state`` may still run on its allocation (unknown states count as yes)."""
    return state not in ENDED_STATES


def job_state(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> str | None:
    """The job's state as slurmctld reports it, or None when it cannot tell.

    None also for a job slurmctld does not know ("Invalid job id"): that is
    what a slurm.conf of another cluster answers too, and a prolog must never
    let a job start without its domain on a guess.
    """
    found = job_record(job_id, host, settings, slurm_conf)
    return found.state if found else None


def job_record(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> JobRecord | None:
    """:func:`ask_job`, or None when slurmctld cannot be asked, does not know the job or answers oddly."""
    try:
        return ask_job(job_id, host, settings, slurm_conf)
    except SlurmQueryError:
        return None


def ask_job(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> JobRecord:
    """The job's own record, asked once (``[commands] squeue``, ``[slurm] query_timeout_s``).

    Args:
        job_id: any job's id (its record alone is taken, also when it is an array's or a het job's).
        host: the seam that runs ``squeue``.
        settings: ``[commands] squeue`` and ``[slurm] query_timeout_s``.
        slurm_conf: the slurm.conf to ask through (the hook's ``SLURM_CONF``; '' for squeue's default).

    Raises:
        SlurmQueryError: slurmctld cannot be asked, does not know the job, or answers in a form
            not read here (the message says which).
    """
    lines = [line for line in _ask(job_id, host, settings, slurm_conf) if line.job_id == job_id]
    if len(lines) != 1:
        raise SlurmQueryError(f"squeue listed job {job_id} {len(lines)} times, not once")
    return _record(lines[0])


def het_nodes(het_job_id: int, host: Host, settings: Settings, slurm_conf: str) -> tuple[tuple[int, str], ...]:
    """``(offset, node)`` of every node of every component of a het job, by component offset.

    Raises:
        SlurmQueryError: slurmctld cannot be asked, or its answer lacks the components or their nodes.
    """
    lines = [ln for ln in _ask(het_job_id, host, settings, slurm_conf) if ln.het_job_id == het_job_id]
    parts = sorted((_record(ln) for ln in lines), key=lambda r: r.het_job_offset or 0)
    offsets = [r.het_job_offset for r in parts]
    if not parts or len(set(offsets)) != len(offsets) or any(not r.trays for r in parts):
        raise SlurmQueryError(f"squeue did not list het job {het_job_id}'s components, each with its nodes")
    return tuple((r.het_job_offset or 0, node) for r in parts for node in r.trays)


def _ask(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> list[_Line]:
    """What ``squeue`` answers about ``job_id``, every line checked."""
    if not 1 <= job_id <= _MAX_ID:
        raise SlurmQueryError(f"{job_id} is not a Slurm job id")
    argv = squeue_argv(settings.commands.squeue, job_id)
    env = {**_ENV, **({var.CONF: slurm_conf} if slurm_conf else {})}
    try:
        done = host.run(argv, timeout_s=settings.slurm.query_timeout_s, env=env)
    except CommandError as exc:
        raise SlurmQueryError(f"cannot ask slurmctld about job {job_id}: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-300:]
        cls = UnknownJob if done.returncode == 1 and done.stderr == _INVALID_ID and not done.stdout else SlurmQueryError
        raise cls(f"squeue --jobs={job_id}: exit {done.returncode}: {said}")
    return parse_answer(done.stdout)


def parse_answer(text: str) -> list[_Line]:
    """The lines of squeue's answer, each field checked (``SlurmQueryError`` names the first that is not)."""
    return [_parse_line(line) for line in text.splitlines() if line]


def _parse_line(line: str) -> _Line:
    values = line.split(SEPARATOR)
    if len(values) != len(FIELDS) + 1 or values[-1]:
        raise SlurmQueryError(f"squeue printed a line that is not {len(FIELDS)} fields: {shorten(line, 120)}")
    job, state, nodes, share, start, restarts, het, offset = values[:-1]
    if not state or not _STATE_CHARS.issuperset(state):
        raise SlurmQueryError(f"squeue printed job state {shorten(state, 40)}")
    if not share or not _STATE_CHARS.issuperset(share):
        raise SlurmQueryError(f"squeue printed OverSubscribe {shorten(share, 40)}")
    if (het == "N/A") != (offset == "N/A"):
        raise SlurmQueryError(f"squeue printed HetJobId {shorten(het, 20)} with HetJobOffset {shorten(offset, 20)}")
    return _Line(
        _number(job, "JobId", 1, _MAX_ID),
        state,
        "" if nodes == "(null)" else nodes,
        share,
        None if start in _NO_TIME else _number(start, "StartTime", 0, 2**63 - 1),
        _number(restarts, "RestartCnt", 0, _MAX_ID),
        None if het == "N/A" else _number(het, "HetJobId", 1, _MAX_ID),
        None if offset == "N/A" else _number(offset, "HetJobOffset", 0, _MAX_ID),
    )


def _number(text: str, field: str, low: int, high: int) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 20) or not low <= int(text) <= high:
        raise SlurmQueryError(f"squeue printed {field} {shorten(text, 40)}, not a number from {low} to {high}")
    return int(text)


def _record(line: _Line) -> JobRecord:
    try:
        trays = tuple(nodelist.expand(line.nodes))
    except NodeListError as exc:
        raise SlurmQueryError(f"squeue printed job {line.job_id}'s node list {exc}") from exc
    return JobRecord(
        line.job_id, line.state, trays, line.oversubscribe, line.start_time, line.restarts,
        line.het_job_id, line.het_job_offset,
    )  # fmt: skip
