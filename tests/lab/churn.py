"""A seeded churn of jobs on a lab of N trays, faults on chosen trays, and an oracle that checks it all (issue 43).

The driver (:class:`Churn`) submits a plan of jobs (:func:`make_plan`, repeatable from its seed) as the lab's
job user: exclusive batch jobs of 1 to N trays placed by slurmctld, some cancelled while their prologs run,
some with a time limit shorter than their script, some requeued once their script runs. Before a job planned
with ``never_ready`` it arms that fault for one tray (the simulator's fault file, ``@<address> never_ready``)
and the job asks for that tray (``-w``); once a job planned with ``kill_daemon`` runs its script, it SIGKILLs
that job's IMEX daemon on one of its trays. It polls slurmctld all along: every drain it sees is recorded with
its reason, the fault of that tray (if any) is cleared, and the tray is resumed once its job has left it, so
the churn goes on; a job held after a failed prolog (``launch_failed_requeued_held``) is cancelled.

Each job's script records when it started, on which trays, and what ``nvidia-imex-ctl -N -j`` says of its
domain on its own tray. After the churn the oracle (:func:`oracle`) reads that, imexctl's log on every tray
and what is left there, and names every job, tray and fact that breaks one of these:

- exactly the trays that met a fault were drained, each with the fault's code, its own name and the job in
  its reason (``imex:not_ready node3 job 500012: ...``, ``imex:daemon_lost ...``); no other tray was;
- nothing is left on any tray: no job directory, channel, daemon or listening port (and none of a job's,
  checked on its trays as soon as it ended);
- no two domains alive at once in one clique held one channel number (a small ``[policy] channel_count``
  makes numbers meet often: the clique's ``2 × trays + 1``);
- every job script started after every tray of its job logged a set-up, ready ``prolog.done``, and the
  domain was UP with all its trays READY and CONNECTED from the script's own tray;
- every job the driver did not cancel ran its script.

With Slurm 23.11 or later the lab runs ``topology/block``, its blocks made by ``imexctl topology blocks`` from
one NVLink domain key per block as a site would, and imexctl reads the same topology.conf.

The lab has names of its own (:data:`NAMES`), so it can be up beside the shared 4-tray labs of the tests.
Used by tests/lab/test_churn_lab.py (the short soak) and ``python -m tests.lab churn`` (the long one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from imexctl.slurm import nodelist
from tests.lab.cluster import SlurmLab, log
from tests.lab.jobs import (
    DONE_STATES,
    IMEXCTL,
    SIM_CTL,
    SLURMD_RETRY_DELAY_S,
    UID,
    USER,
    events,
    imexctl_settings,
    iso_time,
    job_dir,
    leftovers,
    prolog_rpc_retries,
    sim_processes,
)
from tests.lab.versions import LabNames, SlurmInstall

__all__ = [
    "FAULT_CODES",
    "NAMES",
    "Churn",
    "Drain",
    "Evidence",
    "Fault",
    "Finding",
    "JobRun",
    "Mix",
    "Outcome",
    "PlannedJob",
    "Script",
    "channel_findings",
    "churn_lab",
    "drain_findings",
    "faults_met",
    "job_findings",
    "leftover_findings",
    "make_plan",
    "oracle",
    "script_findings",
    "soak",
    "summary",
    "topology_conf",
]

#: the churn lab's names, apart from every other lab's (the shared 4-tray lab of a version may be up beside it)
NAMES = {
    "24.11": LabNames(prefix="imxcg", bridge="imxcgbr0", subnet="198.18.6", ctl_port=6857, first_job_id=600000),
    "26.05": LabNames(prefix="imxch", bridge="imxchbr0", subnet="198.18.5", ctl_port=6847, first_job_id=500000),
}
#: the faults the driver injects, and the code each must leave in its tray's drain reason
FAULT_CODES = {"never_ready": "not_ready", "kill_daemon": "daemon_lost"}
#: sinfo's short states of a tray taken out of service (a trailing ``*`` etc. stripped)
OUT_STATES = ("drain", "drng", "drained", "down", "fail", "failg", "inval")
#: ``imex:<code> <tray> job <id>: <detail>`` (imexctl/slurm/drain.py)
REASON = re.compile(r"^imex:(\S+) (\S+) job (\d+): ")
#: slurm.conf PrologEpilogTimeout of the churn lab, and imexctl's readiness deadline under it: room for a loaded
#: machine, and still the whole [slurm] timeout_margin_s (10 s) for the questions after a failure
PROLOG_TIMEOUT = 60
DEADLINE_S = 20
#: how long a ``kill_daemon`` job's script runs: its daemon is killed as soon as it starts, well before it ends
KILL_SLEEP_S = 20
NODE_TOPOLOGY = "/etc/slurm/topology.conf"
#: a daemon whose start imexctl logged up to this long before a fault was armed may still have read it
ARM_GRACE_S = 5.0


# -- the plan ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mix:
    """What share of the jobs gets each treatment, and how long scripts run."""

    fault_rate: float = 0.05
    cancel_rate: float = 0.08
    time_limit_rate: float = 0.03
    requeue_rate: float = 0.0
    max_sleep_s: int = 8
    #: most jobs are small: of up to this many trays, except a ``big`` share of 1 to all the trays
    small: int = 4
    big: float = 0.25


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """One job of the plan: its size, its script's length, and what the driver does to it."""

    index: int
    size: int
    sleep_s: int
    cancel: bool = False
    time_limit: bool = False
    requeue: bool = False
    fault: str = ""
    #: never_ready: the tray armed before the job is submitted, which the job asks for
    tray: str = ""
    #: kill_daemon: the place in the job's node list of the tray whose daemon is killed (mod its size)
    victim: int = 0


def _size(rng: random.Random, largest: int, mix: Mix) -> int:
    """A job size: up to ``mix.small`` trays, or (a ``mix.big`` share) up to ``largest``."""
    return rng.randint(1, largest if rng.random() < mix.big else min(mix.small, largest))


def _fault_job(rng: random.Random, index: int, kind: str, trays: Sequence[str], largest: int, mix: Mix) -> PlannedJob:
    """A job that meets a fault: never_ready on a tray it asks for (with a healthy peer), or a killed daemon."""
    size = _size(rng, largest, mix)
    if kind == "never_ready":
        return PlannedJob(index, max(size, min(2, largest)), 1, fault=kind, tray=rng.choice(list(trays)))
    return PlannedJob(index, size, KILL_SLEEP_S, fault=kind, victim=rng.randrange(size))


def _plain_job(rng: random.Random, index: int, largest: int, mix: Mix) -> PlannedJob:
    """A job without a fault: cancelled in its prologs, or timed out, or requeued, by the mix's shares, or none."""
    size, sleep_s, roll = _size(rng, largest, mix), rng.randint(1, mix.max_sleep_s), rng.random()
    cuts = (mix.cancel_rate, mix.cancel_rate + mix.time_limit_rate)
    return PlannedJob(
        index,
        size,
        sleep_s,
        cancel=roll < cuts[0],
        time_limit=cuts[0] <= roll < cuts[1],
        requeue=cuts[1] <= roll < cuts[1] + mix.requeue_rate,
    )


def make_plan(seed: int, trays: Sequence[str], jobs: int, mix: Mix, largest: int = 0) -> list[PlannedJob]:
    """Return the jobs of a churn (of at most ``largest`` trays, default all), the same for the same arguments;
    the faults alternate between the kinds."""
    rng = random.Random(seed)
    largest = min(largest or len(trays), len(trays))
    at = sorted(rng.sample(range(jobs), min(jobs, round(jobs * mix.fault_rate))))
    kinds = list(FAULT_CODES)
    first = rng.randrange(len(kinds))
    fault_of = {i: kinds[(first + k) % len(kinds)] for k, i in enumerate(at)}
    return [
        _fault_job(rng, i, fault_of[i], trays, largest, mix) if i in fault_of else _plain_job(rng, i, largest, mix)
        for i in range(jobs)
    ]


# -- what the driver records ------------------------------------------------------------------------------


@dataclasses.dataclass
class JobRun:
    """A submitted job as the driver saw it."""

    plan: PlannedJob
    job: int
    submitted: float
    nodes: list[str] = dataclasses.field(default_factory=list)
    state: str = "PENDING"
    reason: str = ""
    ended: float | None = None
    #: "" (not cancelled), "prolog" (while its prologs ran), "running", "held" (after a failed prolog), "end"
    cancelled: str = ""
    #: the driver killed its daemon, or requeued it (once)
    acted: bool = False


@dataclasses.dataclass
class Fault:
    """A fault the driver injected on a tray, from ``armed`` until ``cleared`` (its drain seen, or the end)."""

    kind: str
    tray: str
    armed: float
    job: int | None = None
    cleared: float | None = None


@dataclasses.dataclass(frozen=True)
class Drain:
    """A tray seen out of service (drained, draining, down) with its reason, when the driver saw it."""

    tray: str
    state: str
    reason: str
    seen: float


@dataclasses.dataclass(frozen=True)
class Finding:
    """What the oracle found wrong: the job (when one is known), the tray, the fact."""

    job: int | None
    tray: str
    fact: str

    def __str__(self) -> str:
        return f"job {self.job if self.job is not None else '?'} tray {self.tray or '?'}: {self.fact}"


@dataclasses.dataclass(frozen=True)
class Script:
    """What a job's script recorded when it started: the time, its tray, its trays, and its domain there."""

    job: int
    restart: int
    start: float
    node: str
    nodes: list[str]
    domain: dict[str, Any] | None
    domain_error: str = ""


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Everything the oracle reads."""

    trays: list[str]
    runs: list[JobRun]
    faults: list[Fault]
    drains: list[Drain]
    events: Mapping[str, list[dict[str, Any]]]
    scripts: list[Script]
    left: Mapping[str, list[str]]


@dataclasses.dataclass
class Outcome:
    """The churn's result: what happened, and the oracle's findings (empty when all held)."""

    evidence: Evidence
    findings: list[Finding]
    wall_s: float
    churn_s: float


# -- the oracle -------------------------------------------------------------------------------------------


def _at(rec: Mapping[str, Any]) -> float:
    return iso_time(str(rec["timestamp"]))


def _of(recs: Iterable[Mapping[str, Any]], event: str, job: int | None = None) -> list[Mapping[str, Any]]:
    return [r for r in recs if r.get("event") == event and (job is None or str(r.get("job_id")) == str(job))]


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _fault_for(faults: Sequence[Fault], drain: Drain) -> int | None:
    """The index of the fault open on the drained tray when the drain was seen."""
    for i, f in enumerate(faults):
        if f.tray == drain.tray and f.armed <= drain.seen and (f.cleared is None or drain.seen <= f.cleared):
            return i
    return None


def met_never_ready(recs: Sequence[Mapping[str, Any]], fault: Fault, grace: float = 0.0) -> list[int]:
    """The jobs whose daemon started on the tray while its never_ready fault was armed (or ``grace`` s before:
    imexctl logs the start when it has spawned the daemon, which reads the fault file a moment later)."""
    end = fault.cleared if fault.cleared is not None else float("inf")
    started = _of(recs, "imex.daemon.started")
    return sorted({int(r["job_id"]) for r in started if fault.armed - grace <= _at(r) <= end})


def _drain_finding(fault: Fault, drain: Drain, recs: Sequence[Mapping[str, Any]]) -> Finding | None:
    """What is wrong with the drain of a faulted tray (None: its code, its tray, a job that met the fault)."""
    m = REASON.match(drain.reason)
    job = int(m.group(3)) if m else fault.job
    want = f"imex:{FAULT_CODES[fault.kind]} {drain.tray} job "
    if not drain.reason.startswith(want) or m is None:
        return Finding(job, drain.tray, f"drained after {fault.kind} with reason {drain.reason!r}, want {want!r}...")
    if fault.kind == "kill_daemon" and job != fault.job:
        return Finding(job, drain.tray, f"drained for job {job}, its daemon killed in job {fault.job}")
    if fault.kind == "never_ready" and job not in met_never_ready(recs, fault, ARM_GRACE_S):
        return Finding(job, drain.tray, f"drained for job {job}, which started no daemon there while never_ready")
    return None


def drain_findings(
    faults: Sequence[Fault],
    drains: Sequence[Drain],
    events_of: Mapping[str, Sequence[Mapping[str, Any]]],
    cancelled_in_prolog: Iterable[int] = (),
) -> list[Finding]:
    """Exactly the faulted trays drained, each with the fault's code, its name and the job that met the fault."""
    out: list[Finding] = []
    ended: set[int] = set()
    for drain in drains:
        i = _fault_for(faults, drain)
        if i is None:
            m = REASON.match(drain.reason)
            what = f"a tray without a fault was taken out of service ({drain.state} at {_stamp(drain.seen)})"
            out.append(Finding(int(m.group(3)) if m else None, drain.tray, f"{what}: {drain.reason!r}"))
            continue
        ended.add(i)
        found = _drain_finding(faults[i], drain, events_of.get(drain.tray, []))
        out += [found] if found else []
    exempt = set(cancelled_in_prolog)
    for i, fault in enumerate(faults):
        if i in ended:
            continue
        if fault.kind == "kill_daemon":
            out.append(Finding(fault.job, fault.tray, "its daemon was killed mid-job and the tray was not drained"))
            continue
        for job in met_never_ready(events_of.get(fault.tray, []), fault):
            if job not in exempt:
                out.append(Finding(job, fault.tray, "its daemon there was never ready and the tray was not drained"))
    return out


_LEFT_JOB = re.compile(r"/jobs/(\d+)(?:/|$| )")


def leftover_findings(left: Mapping[str, Sequence[str]]) -> list[Finding]:
    """Every job directory, channel, daemon or port left on a tray, with the job it belongs to when it says."""
    out = []
    for tray, items in sorted(left.items()):
        for item in items:
            m = _LEFT_JOB.search(item)
            out.append(Finding(int(m.group(1)) if m else None, tray, f"left behind: {item}"))
    return out


@dataclasses.dataclass(frozen=True)
class _Held:
    """One tray's channel of one domain: its clique and number, from its daemon's start to its teardown."""

    job: int
    tray: str
    clique: str
    minor: int
    start: float
    end: float


def _teardown_at(recs: Sequence[Mapping[str, Any]], job: int, after: float) -> float:
    """When the tray tore down ``job``'s domain after ``after``: its epilog, a roll-back or a later prolog."""
    ends = [_at(r) for r in (*_of(recs, "epilog.done", job), *_of(recs, "prolog.rolled_back", job))]
    for r in _of(recs, "state.removed"):
        why = str(r.get("reason", ""))
        if f"leftovers of job {job}," in why or (str(r.get("job_id")) == str(job) and "earlier run" in why):
            ends.append(_at(r))
    return min((t for t in ends if t >= after), default=float("inf"))


def _held_channels(tray: str, recs: Sequence[Mapping[str, Any]]) -> Iterator[_Held]:
    """Every channel a tray held, from its domain's daemon start (or the channel, if no start) to its teardown."""
    for made in _of(recs, "device.channel.created"):
        job, when = int(made["job_id"]), _at(made)
        starts = [_at(r) for r in _of(recs, "imex.daemon.started", job) if _at(r) <= when]
        begin = max(starts, default=when)
        clique = str(made.get("clique", ""))
        yield _Held(job, tray, clique, int(made["minor"]), begin, _teardown_at(recs, job, when))


def _overlaps(held: Sequence[_Held]) -> Iterator[tuple[_Held, _Held]]:
    """Each (earlier, later) pair of different jobs whose times overlap, ``held`` sorted by start."""
    alive: list[_Held] = []
    for h in held:
        alive = [a for a in alive if a.end > h.start]
        yield from ((a, h) for a in alive if a.job != h.job)
        alive.append(h)


def channel_findings(events_of: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Finding]:
    """No two domains (jobs) alive at once in one clique held one channel number, on any of its trays."""
    groups: dict[tuple[str, int], list[_Held]] = {}
    for tray, recs in events_of.items():
        for one in _held_channels(tray, recs):
            groups.setdefault((one.clique, one.minor), []).append(one)
    out = []
    for (clique, minor), held in sorted(groups.items()):
        for a, h in _overlaps(sorted(held, key=lambda x: x.start)):
            until = _stamp(a.end) if a.end < float("inf") else "never torn down"
            fact = (
                f"channel {minor} in clique {clique!r} from {_stamp(h.start)}, while job {a.job} held it "
                f"on {a.tray} ({_stamp(a.start)} to {until})"
            )
            out.append(Finding(h.job, h.tray, fact))
    return out


def _not_set_up(done: Mapping[str, Any]) -> bool:
    return not (done.get("ok") is True and done.get("ready") is True and not done.get("job_ended"))


def _domain_problem(domain: Mapping[str, Any] | None, trays: int) -> str:
    """Why a domain snapshot (``nvidia-imex-ctl -N -j``) is not UP with ``trays`` trays all READY and CONNECTED."""
    if domain is None:
        return "no domain snapshot"
    nodes = domain.get("nodes") or {}
    if domain.get("status") != "UP" or len(nodes) != trays:
        return f"domain {domain.get('status')} with {len(nodes)} nodes, want UP with {trays}"
    for key, info in nodes.items():
        links = {c.get("status") for c in (info.get("connections") or {}).values()}
        if info.get("status") != "READY" or links != {"CONNECTED"} or len(info.get("connections") or {}) != trays:
            return f"node #{key} {info.get('status')} with links {sorted(map(str, links))}"
    return ""


def script_findings(
    scripts: Sequence[Script],
    events_of: Mapping[str, Sequence[Mapping[str, Any]]],
    interrupted: Iterable[int] = (),
) -> list[Finding]:
    """Every script started after a set-up, ready prolog on each of its trays, its domain UP from its own tray
    (the snapshot may be missing for a job the driver cancelled while its script ran)."""
    stopped = set(interrupted)
    out = []
    for s in scripts:
        for tray in s.nodes:
            done = [r for r in _of(events_of.get(tray, []), "prolog.done", s.job) if _at(r) <= s.start]
            if not done:
                out.append(Finding(s.job, tray, f"its script started at {_stamp(s.start)} before any prolog ended"))
            elif _not_set_up(done[-1]):
                out.append(Finding(s.job, tray, f"its script started after a prolog without a domain: {done[-1]}"))
            elif tray == s.node and not (s.job in stopped and s.domain is None):
                problem = s.domain_error or _domain_problem(s.domain, int(done[-1].get("trays", 0)))
                if problem:
                    out.append(Finding(s.job, tray, f"its script saw its domain not UP: {problem}"))
    return out


def job_findings(runs: Sequence[JobRun], scripts: Sequence[Script]) -> list[Finding]:
    """Every job that the driver did not cancel ran its script."""
    ran = {s.job for s in scripts}
    return [
        Finding(r.job, ",".join(r.nodes), f"ended {r.state} ({r.reason}) without running its script")
        for r in runs
        if not r.cancelled and r.state in DONE_STATES and r.job not in ran
    ]


def oracle(ev: Evidence) -> list[Finding]:
    """Every finding of the churn: drains, leftovers, shared channels, scripts without their domain, lost jobs."""
    cancelled = [r.job for r in ev.runs if r.cancelled == "prolog"]
    return [
        *drain_findings(ev.faults, ev.drains, ev.events, cancelled),
        *leftover_findings(ev.left),
        *channel_findings(ev.events),
        *script_findings(ev.scripts, ev.events, [r.job for r in ev.runs if r.cancelled]),
        *job_findings(ev.runs, ev.scripts),
    ]


# -- the lab ----------------------------------------------------------------------------------------------


def blocks_of(trays: Sequence[str], block: int) -> list[list[str]]:
    """The trays cut into blocks of ``block`` (the last may be smaller)."""
    return [list(trays[i : i + block]) for i in range(0, len(trays), block)]


def block_sizes(trays: int, block: int) -> list[int]:
    """topology.conf's BlockSizes: the block, then twice as many up to all the trays."""
    sizes = [block]
    while sizes[-1] * 2 <= trays:
        sizes.append(sizes[-1] * 2)
    return sizes


def topology_conf(trays: Sequence[str], block: int) -> str:
    """topology.conf as a site makes it: ``imexctl topology blocks`` over one NVLink domain key per block."""
    reports = "".join(
        f"{tray} 6f0cbd36-7c3a-4b39-a6f1-{b + 1:012d}.1\n"
        for b, part in enumerate(blocks_of(trays, block))
        for tray in part
    )
    sizes = ",".join(map(str, block_sizes(len(trays), block)))
    done = subprocess.run(
        [str(IMEXCTL), "topology", "blocks", "--block-sizes", sizes],
        input=reports,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def largest_job(trays: int, block: int, topology: bool) -> int:
    """The most trays one job may ask for: under topology/block, the largest of BlockSizes."""
    return block_sizes(trays, block)[-1] if topology else trays


def churn_lab(
    install: SlurmInstall, trays: int, block: int, blocks: bool, workdir: os.PathLike[str] | None = None
) -> SlurmLab:
    """A lab of ``trays`` trays (not up yet); with ``blocks`` (Slurm 23.11+) topology/block in blocks of ``block``."""
    lab = SlurmLab(
        install,
        workdir,
        nodes=trays,
        slurmd_debug="debug",
        prolog_epilog_timeout=PROLOG_TIMEOUT,
        owner_pid=os.getpid(),
    )
    if blocks:
        lab.extra_conf = "TopologyPlugin=topology/block\n"
        lab.extra_etc = {"topology.conf": topology_conf(lab.nodes, block)}
    return lab


def link_topology(lab: SlurmLab) -> None:
    """Each tray's /etc/slurm/topology.conf: a hard link to the lab's, as a site installs one file everywhere."""
    for node in lab.nodes:
        link = lab.node_root(node) / NODE_TOPOLOGY.lstrip("/")
        link.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        os.link(lab.dir / "etc" / "topology.conf", link)


def settings(lab: SlurmLab, block: int) -> dict[str, dict[str, str]]:
    """imexctl.conf for the churn: lost daemons drain, a channel count that makes numbers meet, the blocks."""
    blocks = bool(lab.extra_etc.get("topology.conf"))
    clique = block if blocks else len(lab.nodes)
    out = {
        "readiness": {"deadline_s": str(DEADLINE_S)},
        "policy": {"lost_daemon": "drain", "channel_count": str(2 * clique + 1)},
    }
    if blocks:
        out.update(topology={"source": "topology_conf"}, paths={"topology_file": NODE_TOPOLOGY})
    return out


def save_logs(lab: SlurmLab, dest: Path) -> None:
    """Copy slurmctld's and the slurmds' logs and each tray's imexctl and IMEX logs under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(lab.dir / "log", dest / "log", dirs_exist_ok=True)
    for node in lab.nodes:
        for name in ("imexctl.log", "nvidia-imex.log"):
            src = lab.node_root(node) / "var" / "log" / name
            if src.exists():
                (dest / node).mkdir(exist_ok=True)
                shutil.copy2(src, dest / node / name)


# -- the driver -------------------------------------------------------------------------------------------

QUEUE_SPEC = "JobId:0|,State:0|,Reason:0|,RestartCnt:0|,NodeList:0|"


def queue(lab: SlurmLab) -> dict[int, dict[str, str]]:
    """Every job of the job user that slurmctld still lists: state, reason (blanks as ``_``), restarts, nodes."""
    argv = ["squeue", "--noheader", "--all", "--local", "--states=all", f"--user={USER}", f"--Format={QUEUE_SPEC}"]
    res = lab.run(argv, check=False, timeout=30)
    out = {}
    for line in res.stdout.splitlines() if res.returncode == 0 else []:
        fields = line.split("|")
        if len(fields) == 6 and fields[0].isdigit():
            keys = ("JobState", "Reason", "Restarts", "NodeList")
            out[int(fields[0])] = dict(zip(keys, [fields[1], fields[2].replace(" ", "_"), *fields[3:5]]))
    return out


def in_prolog(state: str, reason: str) -> bool:
    """Whether squeue's state and reason say the job's prologs run (26.05: RUNNING, reason ``Prolog``)."""
    return state == "CONFIGURING" or (state == "RUNNING" and reason == "Prolog")


def _base(state: str) -> str:
    return state.rstrip("*~#!%$@^-")


class Churn:
    """Runs a plan of jobs on an up lab, injects its faults, records what happens and checks it."""

    def __init__(
        self,
        lab: SlurmLab,
        plan: Sequence[PlannedJob],
        *,
        changes: Mapping[str, Mapping[str, str]] | None = None,
        inflight: int = 6,
        churn_s: float = float("inf"),
        settle_s: float = 150,
        poll_s: float = 1.0,
        progress: Callable[[str], None] = log,
    ) -> None:
        self.lab, self.plan = lab, list(plan)
        self.inflight, self.churn_s, self.settle_s, self.poll_s = inflight, churn_s, settle_s, poll_s
        self.progress = progress
        #: imexctl.conf's changes for the churn (:func:`settings`)
        self.changes = dict(changes or {})
        self.out = lab.dir / "out"
        self.runs: dict[int, JobRun] = {}
        self.faults: list[Fault] = []
        self.drains: list[Drain] = []
        self.findings: list[Finding] = []
        #: trays out of service now, with the drain recorded for them, until they are back
        self.out_of_service: dict[str, Drain] = {}
        self.next = 0

    # -- jobs

    def script(self, p: PlannedJob) -> str:
        """The job's script: marks its start, its tray and trays, asks for its domain there, then sleeps."""
        o, lab = self.out, self.lab.dir
        cfg = f"{lab}/nodes/$SLURMD_NODENAME/run/imexctl/jobs/$SLURM_JOB_ID/config.cfg"
        return (
            "r=$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}; "
            f'printf "%s\\n%s\\n%s\\n" "$(date +%s.%N)" "$SLURMD_NODENAME" "$SLURM_JOB_NODELIST" > {o}/.started-$r; '
            f"mv {o}/.started-$r {o}/started-$r; "
            f"{SIM_CTL} -c {cfg} -N -j > {o}/.domain-$r 2>&1; echo rc=$? >> {o}/.domain-$r; "
            f"mv {o}/.domain-$r {o}/domain-$r; sleep {120 if p.time_limit else p.sleep_s}"
        )

    def submit(self, p: PlannedJob) -> JobRun:
        """Submit one planned job as the job user (arming its never_ready fault first)."""
        argv = ["sbatch", "--parsable", "-N", str(p.size), "-t", "0:15" if p.time_limit else "5"]
        argv += ["-J", f"churn{p.index}", "-o", f"{self.out}/%j.out"]
        if p.fault == "never_ready":
            self.arm(p.tray)
            argv += ["-w", p.tray]
        res = self.lab.run([*argv, "--wrap", self.script(p)], user=UID, timeout=60)
        run = JobRun(p, int(res.stdout.strip().split(";")[0]), time.time())
        self.runs[run.job] = run
        self.progress(f"job {run.job}: submitted {p}")
        return run

    def live(self) -> list[JobRun]:
        """The submitted jobs that have not ended."""
        return [r for r in self.runs.values() if r.ended is None]

    def submit_due(self, deadline: float) -> None:
        """Submit the next planned jobs while fewer than ``inflight`` are alive and the churn's time lasts."""
        while self.next < len(self.plan) and len(self.live()) < self.inflight and time.monotonic() < deadline:
            p = self.plan[self.next]
            if p.fault == "never_ready" and (p.tray in self.open_faults() or p.tray in self.out_of_service):
                return  # its tray still has a fault or is out of service: wait
            self.submit(p)
            self.next += 1

    def poll_jobs(self) -> None:
        """Read the queue; note each job's trays and state, and check the trays of each job that ended."""
        seen = queue(self.lab)
        for run in self.live():
            rec = seen.get(run.job)
            if rec is None:
                run.state, run.ended = "PURGED", time.time()
                continue
            run.state, run.reason = rec["JobState"], rec["Reason"]
            if rec["NodeList"] and rec["NodeList"] not in ("(null)", "None_assigned"):
                run.nodes = nodelist.expand(rec["NodeList"])
            if run.state in DONE_STATES:
                run.ended = time.time()
                self.progress(f"job {run.job}: {run.state} on {rec['NodeList']} after {run.ended - run.submitted:.1f}s")
                self.findings += self.job_left(run)

    def job_left(self, run: JobRun) -> list[Finding]:
        """What the job left on its trays once slurmctld says it ended (its epilogs done): directory, daemon."""
        out = [
            Finding(run.job, n, "its job directory outlived the job")
            for n in run.nodes
            if job_dir(self.lab, n, run.job).exists()
        ]
        for pid, argv in sim_processes(self.lab, None, run.job):
            tray = next((n for n in self.lab.nodes if any(f"/nodes/{n}/" in a for a in argv)), "")
            out.append(Finding(run.job, tray, f"its daemon (pid {pid}) outlived the job ({run.state})"))
        return out

    def act(self) -> None:
        """Cancel, kill and requeue what the plan says, when each job gets there; cancel held jobs."""
        for run in self.live():
            p = run.plan
            if run.state == "PENDING" and "held" in run.reason.lower() and run.cancelled != "held":
                self.cancel(run, "held")
            elif p.cancel and not run.cancelled and run.state in ("CONFIGURING", "RUNNING"):
                self.cancel(run, "prolog" if in_prolog(run.state, run.reason) else "running")
            elif (p.fault == "kill_daemon" or p.requeue) and not run.acted and self.script_ran(run):
                run.acted = True
                if p.requeue:
                    self.lab.run(["scontrol", "requeue", str(run.job)], user=UID, check=False, timeout=30)
                    self.progress(f"job {run.job}: requeued while its script runs")
                else:
                    self.kill_daemon(run)

    def script_ran(self, run: JobRun) -> bool:
        """Whether the job's first run has started its script and looked at its domain."""
        return (self.out / f"domain-{run.job}.0").exists()

    def cancel(self, run: JobRun, why: str) -> None:
        """scancel a job as its user, noting when in its life it was cancelled."""
        run.cancelled = run.cancelled or why
        self.lab.run(["scancel", str(run.job)], user=UID, check=False, timeout=30)

    def kill_daemon(self, run: JobRun) -> None:
        """SIGKILL the job's IMEX daemon on its victim tray (the fault starts now), unless the tray has a fault."""
        if not run.nodes:
            return
        tray = run.nodes[run.plan.victim % len(run.nodes)]
        if tray in self.open_faults():
            self.progress(f"job {run.job}: {tray} has a fault already, its daemon is not killed")
            return
        pids = [pid for pid, _ in sim_processes(self.lab, tray, run.job)]
        if not pids:
            self.progress(f"job {run.job}: no daemon of it on {tray} to kill")
            return
        self.faults.append(Fault("kill_daemon", tray, time.time(), job=run.job))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self.progress(f"job {run.job}: killed its daemon on {tray} (pid {','.join(map(str, pids))})")

    # -- faults and trays

    def open_faults(self) -> dict[str, Fault]:
        """The faults not cleared yet, by tray."""
        return {f.tray: f for f in self.faults if f.cleared is None}

    def write_faults(self) -> None:
        """The simulator's fault file: never_ready for every tray armed now."""
        lines = [
            f"@{self.lab.addr(f.tray)} never_ready\n"
            for f in self.faults
            if f.kind == "never_ready" and f.cleared is None
        ]
        tmp = self.lab.faults.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.chmod(0o644)
        tmp.replace(self.lab.faults)

    def arm(self, tray: str) -> None:
        """Arm never_ready for one tray: the next daemon started there never gets ready."""
        self.faults.append(Fault("never_ready", tray, time.time()))
        self.write_faults()
        self.progress(f"armed never_ready on {tray}")

    def clear(self, tray: str, now: float) -> None:
        """Clear the open fault of a tray (its drain was seen, or the churn is over)."""
        for f in self.faults:
            if f.tray == tray and f.cleared is None:
                f.cleared = now
        self.write_faults()

    def poll_trays(self) -> None:
        """Record each tray newly out of service, clear its fault, and resume each drained tray its job has left."""
        now = time.time()
        for tray, st in self.lab.node_states().items():
            state = _base(st["state"])
            if state not in OUT_STATES:
                self.out_of_service.pop(tray, None)
                continue
            if tray not in self.out_of_service:
                drain = Drain(tray, st["state"], st["reason"], now)
                self.drains.append(drain)
                self.out_of_service[tray] = drain
                self.clear(tray, now)
                self.progress(f"{tray} {st['state']}: {st['reason']}")
            if state in ("drain", "drained") and self.settled(tray):
                self.lab.run(["scontrol", "update", f"nodename={tray}", "state=resume"], check=False, timeout=30)

    def settled(self, tray: str) -> bool:
        """Whether the tray's slurmd is done resending its failed prolog's completion (a late one drains it again)."""
        m = REASON.match(self.out_of_service[tray].reason)
        if not m:
            return True
        last = max(prolog_rpc_retries(self.lab, int(m.group(3)), nodes=[tray]), default=None)
        return last is None or (datetime.now() - last).total_seconds() > SLURMD_RETRY_DELAY_S + 2

    # -- the whole churn

    def step(self, deadline: float) -> None:
        """One round: submit, read the queue, act on the jobs, read the trays."""
        self.submit_due(deadline)
        self.poll_jobs()
        self.act()
        self.poll_trays()

    def run(self) -> Outcome:
        """Run the plan (or until ``churn_s``), let every job end, then gather the evidence and check it."""
        t0 = time.monotonic()
        deadline, last_submit = t0 + self.churn_s, None
        shown = 0
        with imexctl_settings(self.lab, self.changes):
            while (self.next < len(self.plan) and time.monotonic() < deadline) or self.live():
                if self.next >= len(self.plan) or time.monotonic() >= deadline:
                    last_submit = last_submit or time.monotonic()
                    if time.monotonic() - last_submit > self.settle_s:
                        self.give_up()
                        break
                self.step(deadline)
                shown = self.show(shown)
                self.pause()
            churn_s = time.monotonic() - t0
            self.wrap_up()
        evidence = self.evidence()
        return Outcome(evidence, [*self.findings, *oracle(evidence)], time.monotonic() - t0, churn_s)

    def pause(self) -> None:
        """Wait for the next round, watching closely the jobs to cancel while their prologs run (a second or two)."""
        end = time.monotonic() + self.poll_s
        waiting = [
            r for r in self.live() if r.plan.cancel and not r.cancelled and r.state in ("PENDING", "CONFIGURING")
        ]
        while waiting and time.monotonic() < end:
            seen = queue(self.lab)
            for run in waiting:
                rec = seen.get(run.job, {})
                if in_prolog(rec.get("JobState", ""), rec.get("Reason", "")):
                    self.cancel(run, "prolog")
                elif rec.get("JobState", "PENDING") != "PENDING":
                    run.state = rec["JobState"]  # too late for the prologs: the next round cancels it running
            waiting = [r for r in waiting if not r.cancelled and r.state in ("PENDING", "CONFIGURING")]
            time.sleep(0.25)
        time.sleep(max(0.0, end - time.monotonic()))

    def show(self, shown: int) -> int:
        """Print a progress line every 25 jobs ended."""
        ended = len(self.runs) - len(self.live())
        if ended // 25 > shown // 25:
            states = Counter(r.state for r in self.runs.values() if r.ended is not None)
            self.progress(f"{ended}/{len(self.plan)} jobs ended: {dict(states)}; {len(self.drains)} drains")
        return ended

    def give_up(self) -> None:
        """The jobs still alive after the settling time: each a finding, then cancelled."""
        for run in self.live():
            self.findings.append(Finding(run.job, ",".join(run.nodes), f"still {run.state} ({run.reason}) at the end"))
            run.cancelled = "end"
            self.lab.run(["scancel", str(run.job)], check=False, timeout=30)
        t = time.monotonic()
        while self.live() and time.monotonic() - t < 60:
            self.poll_jobs()
            time.sleep(self.poll_s)

    def wrap_up(self) -> None:
        """Clear the faults left, then wait (resuming drained trays) until every tray is idle."""
        for tray in list(self.open_faults()):
            self.clear(tray, time.time())
        t = time.monotonic()
        while time.monotonic() - t < 90:
            self.poll_trays()
            if all(st["state"] == "idle" for st in self.lab.node_states().values()):
                return
            time.sleep(self.poll_s)
        self.findings += [
            Finding(None, n, f"not idle after the churn: {st['state']} ({st['reason']})")
            for n, st in self.lab.node_states().items()
            if st["state"] != "idle"
        ]

    def evidence(self) -> Evidence:
        """Read every tray's log and leftovers and every script's records."""
        return Evidence(
            trays=list(self.lab.nodes),
            runs=list(self.runs.values()),
            faults=list(self.faults),
            drains=list(self.drains),
            events={n: events(self.lab, n) for n in self.lab.nodes},
            scripts=read_scripts(self.out),
            left={n: leftovers(self.lab, n) for n in self.lab.nodes},
        )


def read_scripts(out: Path) -> list[Script]:
    """The records every job's script left in ``out`` (started-<job>.<restart>, domain-<job>.<restart>)."""
    scripts = []
    for marker in sorted(out.glob("started-*.*")):
        job, restart = (int(x) for x in marker.name[len("started-") :].split("."))
        start, node, nodes = ([*marker.read_text().splitlines(), "", "", ""])[:3]
        domain, error = None, ""
        snap = out / f"domain-{job}.{restart}"
        text = snap.read_text() if snap.exists() else ""
        try:
            domain = dict(json.loads(text.rsplit("rc=", 1)[0]))
        except ValueError:
            error = f"nvidia-imex-ctl -N -j said {text.strip()[-300:]!r}" if text else "no domain-<job> record"
        scripts.append(
            Script(job, restart, float(start or 0), node, nodelist.expand(nodes) if nodes else [], domain, error)
        )
    return scripts


def faults_met(ev: Evidence) -> Counter[str]:
    """How many faults of each kind a drain ended (the tray met it)."""
    return Counter(ev.faults[i].kind for i in {_fault_for(ev.faults, d) for d in ev.drains} if i is not None)


def summary(outcome: Outcome) -> str:
    """A few lines for humans: jobs by end state, faults met, drains, findings, jobs per hour."""
    ev = outcome.evidence
    states = Counter(r.state for r in ev.runs)
    treated = dict(Counter(r.cancelled for r in ev.runs if r.cancelled))
    per_hour = len(ev.runs) / outcome.churn_s * 3600 if outcome.churn_s else 0.0
    lines = [
        f"jobs: {len(ev.runs)} submitted, ended {dict(sorted(states.items()))}, cancelled by the driver {treated}",
        f"faults: injected {dict(Counter(f.kind for f in ev.faults))}, met (tray drained) {dict(faults_met(ev))}",
        f"{len(ev.drains)} trays taken out of service; {len(ev.scripts)} scripts ran",
        f"churn {outcome.churn_s:.0f} s ({per_hour:.0f} jobs per hour), {outcome.wall_s:.0f} s in all",
        f"oracle: {len(outcome.findings)} finding(s)",
        *(f"  {f}" for f in outcome.findings),
    ]
    return "\n".join(lines)


def soak(
    install: SlurmInstall,
    *,
    trays: int,
    block: int,
    blocks: bool,
    jobs: int,
    seed: int,
    mix: Mix,
    inflight: int = 6,
    churn_s: float = float("inf"),
    settle_s: float = 150,
    logs: Path | None = None,
) -> Outcome:
    """Bring a churn lab up, run the plan of ``seed`` on it, check it, copy its logs to ``logs`` (if given), and
    bring it down."""
    if blocks and trays % block:
        raise ValueError(f"{trays} trays do not make blocks of {block}")
    lab = churn_lab(install, trays, block, blocks)
    lab.up(timeout=60 + 2 * trays)
    try:
        if blocks:
            link_topology(lab)
        plan = make_plan(seed, lab.nodes, jobs, mix, largest_job(trays, block, blocks))
        churn = Churn(lab, plan, changes=settings(lab, block), inflight=inflight, churn_s=churn_s, settle_s=settle_s)
        outcome = churn.run()
        if logs is not None:
            save_logs(lab, logs)
        return outcome
    finally:
        lab.down()
