"""Domains torn down on this tray that may live on elsewhere in its clique, and the prolog's wait for them.

Two IMEX domains alive at once in one NVLink clique get one channel number
only when they have the same first tray (design.md "The channel rule").
slurmctld returns a COMPLETING job's trays to service one by one, as each
tray's epilog ends (design.md source slurm-completing-nodes), so a new job
can start on the first tray of an old domain while the old domain's epilog,
daemon and channel still live on another of its trays.  The first tray tore
the old domain down itself, so it can tell: teardown records each domain it
removes (:func:`remember`: its channel, job, run and trays, and by when all
its epilogs must have ended) in ``<run_dir>/remnants.json`` (root's, mode
0600, written whole, at most :data:`KEEP` domains, each kept until then), and
a prolog about to take a channel number waits, before its daemon starts
(:func:`wait_gone`), until every remembered domain of that number that may
still live on trays outside the new domain is gone.

Gone is slurmctld's word, asked only in this case and only under slurmd
(design.md source slurm-no-commands): the old job holds none of those trays
any more (a COMPLETING job's node list names only the trays whose epilog has
not ended), or it holds no record of the job (it purges one only after its
last epilog).  While slurmctld does not answer, the time by which the old
domain's epilogs must have ended, by this tray's clock, decides.  A prolog
whose deadline comes first fails with a reason that names the old job and
its trays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from imexctl.hooks.jobs import CLOCK_SLACK_S, epilog_waits
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import JobState
from imexctl.platform import Record
from imexctl.platform.errors import DomainBusyError, SlurmQueryError
from imexctl.platform.fsutil import atomic_write, read_text_nofollow
from imexctl.slurm import nodefold

__all__ = ["FILE", "KEEP", "Remnant", "load", "path", "remember", "wait_gone"]

#: the file in the run directory
FILE: Final = "remnants.json"
#: the most domains remembered: the newest are kept
KEEP: Final = 64


class Remnant(Record):
    """A domain torn down on this tray whose other trays may still hold it, and its channel."""

    job_id: int
    #: the domain's channel number
    channel: int
    #: the domain's trays (this one among them)
    trays: tuple[str, ...]
    #: when its epilog began here (or its teardown, without one), this tray's clock
    ended: float
    #: by when every epilog of the domain must have ended, by this tray's clock (slack included)
    until: float
    #: the run of the job that set it up (``state.json``'s restart count and start time; None: not said)
    restarts: int | None = None
    start_time: int | None = None


def path(rt: Runtime) -> Path:
    """``<run_dir>/remnants.json``."""
    return rt.settings.paths.run_dir / FILE


def remember(state: JobState | None, rt: Runtime) -> None:
    """Record the domain of ``state``, being torn down on this tray, while its other trays may still hold it.

    Only a domain with a channel and other trays is kept.  Its bound is when
    its epilog here has ended at the latest (the epilog's own recorded
    deadline, else every wait of today's settings from its start), plus
    :data:`~imexctl.hooks.jobs.CLOCK_SLACK_S` for the other trays' epilogs,
    which begin when their slurmd has ended the job's steps there.  Domains
    past their bound are dropped.  Called under the node lock; best effort: a
    record that cannot be written is logged (``imex.channel.memory_failed``)
    and the teardown goes on.
    """
    if state is None or state.channel_minor is None or len(state.nodes) < 2:
        return
    now = rt.host.time()
    ended = state.ended or now
    deadline = state.epilog_deadline or ended + epilog_waits(rt.settings.daemon, rt.settings.daemon.process_wait_s)
    gone = Remnant(
        state.job_id, state.channel_minor, tuple(state.nodes), ended, max(deadline, now) + CLOCK_SLACK_S,
        state.restarts, state.start_time,
    )  # fmt: skip
    kept = [r for r in load(rt) if r.until > now and r.job_id != state.job_id]
    try:
        atomic_write(path(rt), _encode([*kept, gone][-KEEP:]), mode=0o600)
    except OSError as exc:
        rt.log.warning("imex.channel.memory_failed", path=str(path(rt)), problem=exc.strerror or str(exc))


def load(rt: Runtime) -> list[Remnant]:
    """The remembered domains, oldest first; [] without the file, and (logged) when it cannot be read."""
    where = path(rt)
    try:
        return _decode(read_text_nofollow(where, trusted=True))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        rt.log.warning("imex.channel.memory_failed", path=str(where), problem=problem)
        return []


def wait_gone(
    job_id: int, channel: int, trays: Sequence[str], rt: Runtime, *, slurm_conf: str, deadline: float
) -> None:
    """Wait until no remembered domain that may still hold channel ``channel`` lives outside ``trays``.

    ``job_id`` and ``trays`` are the new domain's (another run of the same
    job starts only once every epilog of the last has ended: never waited
    for).  A remembered domain counts while its bound lies ahead and some of
    its trays are not the new domain's: a tray of the new domain has been
    given to the new job, so its epilog of the old one has ended.  Each is
    waited for until slurmctld says it is gone (asked each ``[readiness]
    poll_max_s``, only under slurmd: ``slurm_conf``) or, while slurmctld
    does not answer, until its bound.  ``imex.channel.waited`` says how long
    and why it ended.  Outside slurmd (no ``slurm_conf``: ``imexctl demo``,
    the simulator) nothing is waited for: there a domain has no clique (the
    job-id rule) and no Slurm ends jobs, so no overlap is Slurm's, and a
    crashed run's leftovers would hold the next prolog for the whole bound.

    Raises:
        DomainBusyError: ``deadline`` (the host's monotonic clock) came first; naming the old job and its trays.
    """
    if not slurm_conf:
        return
    now = rt.host.time()
    for old in load(rt):
        away = tuple(t for t in old.trays if t not in trays)
        if old.channel == channel and old.job_id != job_id and away and now < old.until:
            _wait_one(old, away, channel, rt, slurm_conf=slurm_conf, deadline=deadline)


def _wait_one(
    old: Remnant, away: tuple[str, ...], channel: int, rt: Runtime, *, slurm_conf: str, deadline: float
) -> None:
    """Wait for one remembered domain (:func:`wait_gone`)."""
    t0, said = rt.host.monotonic(), ""
    while True:
        answer = _slurmctld_says(old, away, rt, slurm_conf)
        if answer is not None and not answer[0]:
            how = answer[1]
            break
        said = answer[1] if answer is not None else said
        if answer is None and rt.host.time() >= old.until:
            how = "slurmctld did not answer, and the time its epilogs may take has passed"
            break
        left = deadline - rt.host.monotonic()
        if left <= 0:
            raise DomainBusyError(
                f"channel {channel} of this domain may still be held in its NVLink clique by job {old.job_id}'s "
                f"IMEX domain on {nodefold.fold(list(away))}, whose epilog has not ended there "
                f"({said or 'slurmctld did not answer'}); waited {rt.host.monotonic() - t0:.1f}s: "
                f"see why that epilog takes so long (imexctl why {old.job_id} on those trays)"
            )
        rt.host.sleep(min(rt.settings.readiness.poll_max_s, left))
    rt.log.info(
        "imex.channel.waited",
        channel=channel,
        old_job_id=old.job_id,
        trays=nodefold.fold(list(away)),
        waited_s=round(rt.host.monotonic() - t0, 3),
        how=how,
    )


def _slurmctld_says(old: Remnant, away: tuple[str, ...], rt: Runtime, slurm_conf: str) -> tuple[bool, str] | None:
    """Whether slurmctld says the old domain may still live on ``away``, and what it said; None: no answer.

    It may while the old job is COMPLETING on one of those trays (the node
    list of a COMPLETING job names the trays whose epilog has not ended), or
    still runs there in the same run (a job that gave up this tray and kept
    others).  An ended, pending or requeued job, or a later run of it
    (another restart count or start time: another domain), holds none; nor
    does a job slurmctld no longer holds (``UnknownJob``: it ran here, so it
    was purged, ``MinJobAge`` after its last epilog; issue 43: read as no
    answer, it kept a new domain of the same channel waiting until its
    deadline, and drained every tray of it).
    """
    if not slurm_conf:
        return None
    from imexctl.slurm import slurmctld

    try:
        found = slurmctld.ask_job(old.job_id, rt.host, rt.settings, slurm_conf)
    except slurmctld.UnknownJob:  # it ran here, so slurmctld purged it: after every epilog of it ended
        return False, f"slurmctld no longer holds job {old.job_id}: it purges a job once all its epilogs have ended"
    except SlurmQueryError:
        return None
    holds = [t for t in away if found.holds(t)]
    if found.state != "COMPLETING" and not found.wants_to_start:
        return False, f"slurmctld says job {old.job_id} is {found.state}"
    if not holds:
        return False, f"slurmctld says job {old.job_id} ({found.state}) holds none of them"
    if found.state != "COMPLETING" and _another_run(old, found.restarts, found.start_time):
        return False, f"slurmctld says job {old.job_id} runs again ({found.state}): another domain"
    return True, f"slurmctld says job {old.job_id} is {found.state} on {nodefold.fold(holds)}"


def _another_run(old: Remnant, restarts: int, start_time: int | None) -> bool:
    """Whether slurmctld's restart count or start time shows another run than the remembered domain's."""
    if old.restarts is not None and restarts != old.restarts:
        return True
    return old.start_time is not None and start_time is not None and start_time != old.start_time


def _encode(domains: Sequence[Remnant]) -> str:
    import json

    return json.dumps({"domains": [r._asdict() for r in domains]}, indent=1) + "\n"


def _decode(text: str) -> list[Remnant]:
    """The file's domains, every field checked.

    Raises:
        ValueError: not what :func:`remember` writes.
    """
    import json

    found = json.loads(text)
    entries = found.get("domains") if isinstance(found, dict) else None
    return [_remnant(entry) for entry in _listed(entries)]


def _listed(value: object) -> list[object]:
    """``value`` if it is a JSON list.

    Raises:
        ValueError: it is not (a file :func:`remember` did not write).
    """
    if isinstance(value, list):
        return value
    raise ValueError("not a list of domains")


def _remnant(found: object) -> Remnant:
    entry = found if isinstance(found, dict) else {}
    if set(entry) != set(Remnant._fields):
        raise ValueError(f"a domain without the fields {', '.join(Remnant._fields)}")
    ids = [entry["job_id"], entry["channel"]] + [v for v in (entry["restarts"], entry["start_time"]) if v is not None]
    times = [entry["ended"], entry["until"]]
    trays = entry["trays"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ids):
        raise ValueError("a job id, channel, restart count or start time that is no whole number")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in times):
        raise ValueError("a time that is no number")
    if not isinstance(trays, list) or not all(isinstance(t, str) for t in trays):
        raise ValueError("trays that are no list of names")
    return Remnant(**{**entry, "trays": tuple(trays)})
