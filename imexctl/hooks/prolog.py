"""The prolog: set up this tray's part of the job's IMEX domain, or undo all of it.

Steps, in order (docs/design.md "The prolog, step by step"): read the job;
policy, shared-node and fabric gates (a skipped job touches nothing); the
tray's domain members; then, under the node lock, claim the node, resolve,
write the files, start the daemon, wait for readiness and create the channel.
Any failure after the claim rolls back everything through ``teardown``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from imexctl import slurm as var
from imexctl.channels import devices
from imexctl.config.paths import JobDir
from imexctl.config.settings import Settings
from imexctl.gpu.fabric import fabric_key
from imexctl.hooks import members, remnants, requeue
from imexctl.hooks.gate import Skip, shared_reason, skipped_prolog
from imexctl.hooks.jobs import other_run, scan_jobs, still_runs_here
from imexctl.hooks.results import PrologResult, Setup, texts
from imexctl.hooks.runtime import Runtime, bind, log_failed, terminations
from imexctl.hooks.state import JobState, mark_state, node_lock, read_state, write_state
from imexctl.hooks.teardown import teardown
from imexctl.imex import config as imexconf
from imexctl.imex import daemon, peerauth
from imexctl.platform.errors import (
    ConfigError,
    DomainBusyError,
    FileError,
    GpuError,
    HealthTimeout,
    ImexctlError,
    SlurmQueryError,
    Terminated,
    UnsafeNodeError,
)
from imexctl.platform.fsutil import atomic_write, ensure_dir
from imexctl.platform.host import Host, ProcInfo
from imexctl.slurm import conf as slurmconf
from imexctl.slurm import drain, nodefold
from imexctl.slurm import slurmctld as slurmctl
from imexctl.slurm.job import SHARING_UNKNOWN, JobContext, node_name
from imexctl.slurm.topofile import BlockMap

__all__ = ["SHARING_PAUSE_S", "SHARING_TRIES", "prolog"]

#: how often a prolog asks slurmctld whether its job may share its trays (Slurm 22.05), and the pause between
SHARING_TRIES = 3
SHARING_PAUSE_S = 1.0


class _Run:
    """What one prolog run has learned so far, for its summary and its failure path (mutable)."""

    __slots__ = (
        "conf",
        "deadline_s",
        "defer_batch",
        "hook_timeout",
        "hook_timeout_s",
        "job",
        "names",
        "slurm_channels",
        "t0",
    )

    def __init__(self, t0: float, job: JobContext | None = None, *, deadline_s: float = 0.0) -> None:
        self.t0 = t0
        self.job = job
        self.deadline_s = deadline_s
        #: which slurm.conf setting bounds this hook, e.g. ``PrologEpilogTimeout=30s``, and its seconds
        self.hook_timeout = ""
        self.hook_timeout_s: float | None = None
        #: slurm.conf's PrologFlags hold the batch script until every tray's prolog reported (DeferBatch)
        self.defer_batch = False
        #: slurm.conf sets SwitchType=switch/nvidia_imex: Slurm's plugin owns the channels
        self.slurm_channels = False
        #: address -> node name of the domain's trays, once resolved (the drain reason names trays)
        self.names: dict[str, str] = {}
        #: the job's slurm.conf as read (None: no SLURM_CONF, or unreadable)
        self.conf: slurmconf.SlurmConf | None = None


def prolog(env: Mapping[str, str], rt: Runtime, job: JobContext | None = None) -> PrologResult:
    """Set up the job's IMEX domain on this tray, or roll back and raise.

    ``job`` is the job as the caller already read it from ``env`` (None: read
    here).  A failure that only comes from the job having been cancelled
    meanwhile (slurmctld says so when asked) is no failure: the roll-back is
    done and the prolog exits 0, so no healthy node is drained for it.

    Returns:
        The summary logged as ``prolog.done`` (one line per run, also on failure).
    """
    run = _Run(rt.host.monotonic(), job, deadline_s=rt.settings.readiness.deadline_s)
    with terminations(lambda exc: _on_signal(exc, run, rt)):
        try:
            return _prolog(env, rt, run)
        except ImexctlError as exc:
            return _failed(exc, run, rt, env)


def _on_signal(exc: Terminated, run: _Run, rt: Runtime) -> None:
    """Write the summary line at once: SIGKILL follows SIGTERM within 10 ms."""
    elapsed = rt.host.monotonic() - run.t0
    why = f"{exc} after {elapsed:.1f}s"
    if run.hook_timeout:
        why += f" (slurm.conf {run.hook_timeout}; readiness deadline {run.deadline_s:g}s)"
    else:
        why += f"; is the hook timeout in slurm.conf shorter than [readiness] deadline_s={run.deadline_s:g}s?"
    exc.args = (why,)
    log_failed("prolog.done", exc, rt, run.t0)


def _failed(exc: ImexctlError, run: _Run, rt: Runtime, env: Mapping[str, str]) -> PrologResult:
    """Exit 0 for a job that will not run here any more, if this tray did its part; else fail.

    A prolog whose domain never came up (``not_ready``) asks slurmctld before
    it fails, whoever it thinks is at fault (``requeue.job_gone``): a tray sure
    of its own fault (its daemon never got READY, or its verdict) once,
    whether the job is over (a requeue is no end); any other whether the job
    was taken back, once or under ``PrologFlags=DeferBatch`` until a window
    closes.  Its roll-back is done by then; the drain comes after the answer.
    Any other failure is the tray's whatever became of the job, and drains
    it with its own reason (``slurm.drain``).
    """
    if isinstance(exc, HealthTimeout) and run.job is not None and rt.settings.slurm.check_cancelled == "yes":
        elapsed = rt.host.monotonic() - run.t0
        state = requeue.job_gone(
            rt, exc, run.job, elapsed_s=elapsed, hook_timeout_s=run.hook_timeout_s, defer_batch=run.defer_batch
        )
        if state is not None:
            rt.log.info("prolog.job_ended", job_state=state, reason=requeue.ended_reason(exc))
            return _done(rt, run.t0, job_ended=state)
    if not exc.logged:
        log_failed("prolog.done", exc, rt, run.t0)
    if not isinstance(exc, Terminated):  # SIGKILL follows SIGTERM within 10 ms: no time to ask slurmctld
        _leave_reason(exc, run, rt, env)
    raise exc


def _leave_reason(exc: ImexctlError, run: _Run, rt: Runtime, env: Mapping[str, str]) -> None:
    """Drain this node with the failure's own reason before slurmd reports it (``[slurm] drain_reason``)."""
    try:
        node = run.job.node if run.job is not None else node_name(env)
    except ImexctlError:  # SLURMD_NODENAME unusable: Slurm's "Prolog error" stands
        return
    detail = (exc.summary if isinstance(exc, HealthTimeout) else "") or str(exc)
    text = drain.reason(exc.code, node, detail, run.names, job=run.job.job_id if run.job is not None else None)
    slurm_conf = run.job.slurm_conf if run.job is not None else var.value(env, var.CONF).strip()
    drain.leave(rt.host, rt.settings, rt.log, node=node, slurm_conf=slurm_conf, text=text)


def _prolog(env: Mapping[str, str], rt: Runtime, run: _Run) -> PrologResult:
    job = run.job = run.job or JobContext.from_env(env, need_nodes=True)
    bind(rt, job_id=job.job_id, node=job.node)
    job, skip = _gates(job, rt, run)
    if skip is not None:
        unknown = job.sharing_from == SHARING_UNKNOWN
        return _done(rt, run.t0, skipped=skip.reason, told_user=skip.told, sharing_unknown=unknown)
    if job.qos or job.sluid:  # Slurm 26.05's QOS and 25.11's SLUID: in every line of a set-up
        bind(rt, **{k: v for k, v in (("qos", job.qos), ("sluid", job.sluid)) if v})
    _refuse_shared(job, rt)
    deadline = run.t0 + _read_slurm_conf(job, rt, run)
    no_fabric, key = _no_fabric(rt, deadline)
    if no_fabric:
        _refuse_without_fabric(job, no_fabric, rt)
        return _done(rt, run.t0, skipped=no_fabric)
    job = _het_domain(job, rt)
    source = members.load_source(rt.settings)
    trays = members.job_domain(job.nodes, job.node, rt.settings, key, rt.log, source)  # cross-checks the NVML key
    single = rt.settings.policy.single_tray if len(trays) == 1 else "domain"
    if single == "none":
        return _done(rt, run.t0, skipped="the job has one tray in this NVLink domain ([policy] single_tray = none)")
    if single == "domain":
        peerauth.check(rt.settings)  # the daemon's key files, before anything is created (design.md step 5)
    place = _channel_place(trays, source, run, rt)
    with node_lock(rt.settings.paths.lock_file, rt.host, rt.settings.daemon.lock_timeout_s):
        rt.step("locked")
        own = _claim(job, trays, rt)
        rt.step("claimed")
        try:
            if own is None:
                setup = _setup(job, trays, rt, deadline, with_daemon=single == "domain", place=place, names=run.names)
                _mark_set_up(job, rt)
            else:  # this run's prolog ran here before (slurmd restarted during it, say): its domain stays
                setup = _keep(job, own, rt, deadline)
            setup = setup._replace(block=members.block_label(job.node, source, key))
        except BaseException as exc:
            _rollback(job.job_id, rt, exc)
            raise
    return _done(rt, run.t0, deadline_s=run.deadline_s, setup=setup)


def _done(rt: Runtime, t0: float, **summary: Any) -> PrologResult:
    """Log the prolog's summary (``imex.skipped`` first for a skipped job) and return it."""
    result = PrologResult(round(rt.host.monotonic() - t0, 3), **summary)
    result.log(rt.log)
    return result


def _read_slurm_conf(job: JobContext, rt: Runtime, run: _Run) -> float:
    """Read the job's slurm.conf once: whether Slurm owns the channels, and the deadline in effect."""
    if not job.slurm_conf:
        return run.deadline_s
    try:
        conf = slurmconf.read(Path(job.slurm_conf))
        found = slurmconf.hook_timeout(conf, "prolog")
    except ConfigError as exc:
        rt.log.warning("prolog.deadline", deadline_s=run.deadline_s, problem=str(exc))
        return run.deadline_s
    run.conf = conf
    run.slurm_channels = (conf.get("SwitchType") or "").strip() == "switch/nvidia_imex"
    run.defer_batch = slurmconf.batch_waits_for_prologs(slurmconf.prolog_flags(conf))
    return _capped_deadline(found, rt, run)


def _capped_deadline(found: tuple[int, str] | None, rt: Runtime, run: _Run) -> float:
    """``[readiness] deadline_s``, capped below slurm.conf's hook timeout with a margin for the roll-back.

    Without the cap slurmd would kill a prolog that waits longer than its
    timeout (SIGTERM, then SIGKILL), and the reason would be lost.
    """
    s = rt.settings.slurm
    if found is None:
        return run.deadline_s
    timeout, key = found
    # named in the reason of a prolog slurmd kills, also when the cap is off
    run.hook_timeout, run.hook_timeout_s = f"{key}={timeout}s", float(timeout)
    if s.cap_deadline != "yes":
        return run.deadline_s
    cap = max(timeout / 2, timeout - s.timeout_margin_s)
    if cap < run.deadline_s:
        rt.log.info("prolog.deadline", deadline_s=cap, configured_s=run.deadline_s, hook_timeout=run.hook_timeout)
        run.deadline_s = cap
    return run.deadline_s


def _no_fabric(rt: Runtime, deadline: float) -> tuple[str, str | None]:
    """Why NVML says this tray takes no part ('' when it does, or when the check is off), and its key."""
    if rt.settings.policy.fabric != "nvml":
        return "", None
    key = fabric_key(rt.gpu, rt.host, rt.settings, deadline=deadline, log=rt.log)
    return ("" if key else "this tray has no multi-node NVLink fabric (NVML)"), key


def _refuse_without_fabric(job: JobContext, no_fabric: str, rt: Runtime) -> None:
    """Fail a tray without a fabric that the job's domain counts among its trays: the fault is this tray's.

    Skipping it would leave its peers waiting for a daemon that never
    starts, and the first of them to time out would be drained instead.  A
    one-tray job, or a tray the topology source puts in no domain (a CPU
    node in the job, say), is skipped as before.
    """
    try:
        trays = members.domain_members(job.nodes, job.node, members.load_source(rt.settings))
    except ConfigError:  # in no block of the topology: part of no IMEX domain
        return
    if len(trays) > 1:
        raise GpuError(
            f"{no_fabric}, yet job {job.job_id}'s IMEX domain counts this tray among its {len(trays)} trays "
            f"and its peers would wait for it: check the tray's fabric (imexctl topology), or keep it out of "
            "IMEX partitions"
        )


def _het_domain(job: JobContext, rt: Runtime) -> JobContext:
    """A het job's components share one IMEX domain, keyed by the het job id (``[slurm] het_jobs``)."""
    if job.het_job_id is None:
        return job
    if rt.settings.slurm.het_jobs == "per_component":
        rt.log.info("imex.het_job", het_job_id=job.het_job_id, mode="per_component", trays=len(job.nodes))
        return job
    found = slurmctl.het_nodes(job.het_job_id, rt.host, rt.settings, job.slurm_conf)
    nodes = tuple(dict.fromkeys(node for _, node in found))
    if job.node not in nodes:
        raise SlurmQueryError(f"slurmctld does not list this node {job.node} in het job {job.het_job_id}")
    components = len({offset for offset, _ in found})
    rt.log.info("imex.het_job", het_job_id=job.het_job_id, mode="joint", components=components, trays=len(nodes))
    return job.replace(job_id=job.het_job_id, nodes=nodes)


def _skip(job: JobContext, rt: Runtime) -> Skip | None:
    """``gate.skipped_prolog`` with the settings; a note that could not be left is a warning, never a failure."""
    skip = skipped_prolog(job, rt.settings.policy, rt.settings.node_paths)
    if skip is not None and skip.problem:  # the job runs all the same: no fault of the tray worth a drain
        rt.log.warning("imex.note_failed", problem=skip.problem)
    return skip


def _gates(job: JobContext, rt: Runtime, run: _Run) -> tuple[JobContext, Skip | None]:
    """The job (asked about under Slurm 22.05, which does not say whether it shares) and why policy skips it."""
    skip = _skip(job, rt)
    if skip is None and job.is_shared is None:
        job = run.job = _ask_sharing(job, rt)
        skip = _skip(job, rt)
    return job, skip


def _ask_sharing(job: JobContext, rt: Runtime) -> JobContext:
    """Slurm 22.05 does not tell the prolog whether the job may share its trays: ask slurmctld, again within a bound.

    Only under slurmd (``SLURM_CONF`` set) and with ``[slurm] ask_sharing =
    yes``: up to :data:`SHARING_TRIES` questions, :data:`SHARING_PAUSE_S`
    apart, each bounded by ``[slurm] query_timeout_s``.  Still no answer: the
    job counts as one that may share (``SHARING_UNKNOWN``: no domain, the
    user's note, whatever ``[policy] shared`` says), and ``imex.sharing_unknown``
    is logged and counted.  A domain is never set up for a job that may share
    its trays, and a prolog never fails for a question it could not ask.
    """
    if rt.settings.slurm.ask_sharing != "yes" or not job.slurm_conf:
        return job
    problem = ""
    for attempt in range(1, SHARING_TRIES + 1):
        try:
            found = slurmctl.ask_job(job.job_id, rt.host, rt.settings, job.slurm_conf)
        except SlurmQueryError as exc:
            problem = str(exc)
        else:
            return job.replace(oversubscribe=found.oversubscribe, sharing_from="slurmctld")
        if attempt < SHARING_TRIES:
            rt.host.sleep(SHARING_PAUSE_S)
    rt.log.warning(
        "imex.sharing_unknown",
        tries=SHARING_TRIES,
        problem=problem,
        reason="no IMEX domain: the job may share its trays",
    )
    return job.replace(sharing_from=SHARING_UNKNOWN)


def _refuse_shared(job: JobContext, rt: Runtime) -> None:
    """``[policy] shared = refuse``: fail the prolog of a job that may share its trays (Slurm drains them)."""
    why = shared_reason(job)
    if why and rt.settings.policy.shared == "refuse":
        raise DomainBusyError(f"{why} ([policy] shared = refuse)")


def _claim(job: JobContext, trays: tuple[str, ...], rt: Runtime) -> JobState | None:
    """Refuse a node whose domain is held by a job that still runs here or a stray daemon; clear leftovers.

    Leftovers of jobs that no longer run on this tray (a daemon that died and
    an epilog killed at its timeout, say) are torn down as ``cleanup`` would,
    so the tray is not drained job after job until an admin comes.

    Returns:
        This job's own domain, when an earlier prolog of this very run finished
        setting it up here and its daemon runs (``_this_run``): it is kept.
        Any other leftover of this job is torn down first (None).
    """
    # only a daemon counts: a pager on a job's file, a ctl client, another user's process never block (issue 22)
    jobs, strays = scan_jobs(rt)
    held = _clear_ended_jobs(job, [j for j in jobs if j != job.job_id], rt)
    if held:
        other, why = held[0]
        raise DomainBusyError(
            f"this node's IMEX domain belongs to job {other}, which {why} "
            f"(if that job has ended: 'imexctl cleanup --job {other} --force')"
        )
    if strays:
        raise DomainBusyError(f"a stray IMEX daemon runs (pid {strays[0].pid}: {' '.join(strays[0].cmdline)})")
    jd = rt.settings.paths.job(job.job_id)
    if not jd.exists():
        return None
    state = read_state(jd)
    why = _this_run(job, trays, state, rt)
    if not why:
        return state
    rt.log.warning(
        "state.removed",
        reason=f"leftovers of an earlier run of this job ({why})",
        actions=texts(teardown(job.job_id, rt)),
    )
    return None


def _this_run(job: JobContext, trays: tuple[str, ...], state: JobState | None, rt: Runtime) -> str:
    """'' when ``state`` is this very run's domain on this tray, set up and with its daemon; else why not.

    slurmd restarted during a prolog runs it again for the same job: the first
    may have finished, and its peers use the domain.  The same run: the same
    tray, trays and owner, and the restart count and start time slurmd gave
    (where it gave them; a requeued job has another).
    """
    if state is None or not state.set_up:
        return "its prolog did not finish"
    if state.ended:
        return "its epilog ran"
    if (state.node, state.nodes, (state.uid, state.gid)) != (job.node, trays, job.owner):
        return "another tray, tray list or owner"
    another = other_run(state, job.restarts, job.start_time)
    if another:
        return another
    if state.backend == "none":
        return "" if not state.channel_path or os.path.lexists(state.channel_path) else "its channel is gone"
    if daemon.daemon_runs(rt.host, rt.settings, rt.settings.paths.job(job.job_id), state.backend) is False:
        return "its daemon is gone"
    return ""


def _keep(job: JobContext, state: JobState, rt: Runtime, deadline: float) -> Setup:
    """This run's own domain, set up here by an earlier prolog: left as it is once it answers ready.

    Nothing is written, started or stopped; the readiness wait is the set-up's
    (a domain that does not get ready fails this prolog as it would have the first).
    """
    rt.log.info("imex.domain.kept", reason="this job's prolog ran before on this tray and set up its domain")
    if state.backend == "none":
        return Setup(len(state.nodes), state.channel_path, daemon=False)
    jd, own = rt.settings.paths.job(job.job_id), state.addresses[state.nodes.index(job.node)]
    ready = _wait_ready(jd, own, state.addresses, (state.port, state.cmd_port), rt, deadline)
    blamed = tuple(ready.blamed)
    return Setup(
        len(state.nodes), state.channel_path, port=state.port, cmd_port=state.cmd_port, ready=ready.ready, blamed=blamed
    )


def _clear_ended_jobs(job: JobContext, others: list[int], rt: Runtime) -> list[tuple[int, str]]:
    """Tear down what other jobs left here if they no longer run; return those that may still run, and why.

    Decided on the tray and, in its doubt, by slurmctld, once per job
    (``jobs.still_runs_here``: the one place that asks).  No answer keeps the job.
    """
    held = []
    for other in others:
        live = still_runs_here(other, rt, node=job.node, slurm_conf=job.slurm_conf)
        if live.runs:
            held.append((other, live.why))
            continue
        rt.log.warning(
            "state.removed",
            reason=f"leftovers of job {other}, which no longer runs here" + (f" ({live.why})" if live.why else ""),
            actions=texts(teardown(other, rt)),
        )
    return held


def _setup(
    job: JobContext,
    trays: tuple[str, ...],
    rt: Runtime,
    deadline: float,
    *,
    with_daemon: bool,
    place: members.Place | None,
    names: dict[str, str],
) -> Setup:
    """Resolve, write the files, start the daemon, wait for readiness, create the channel (at ``place``).

    ``names`` gets each tray's address -> node name once they are resolved.
    """
    if not with_daemon:
        return _setup_channel_only(job, trays, rt, place, deadline)
    try:
        addresses = _resolve(job, trays, rt)
        names.update(zip(addresses, trays))
        own = addresses[trays.index(job.node)]
        channel = _plan_channel(job, trays, place, rt, deadline)
        ports = _ports(job, rt)
        jd = _write_files(job, trays, addresses, ports, channel, rt)
        rt.step("files_written")
        _start(jd, own, ports, rt)
        rt.step("daemon_started")
        ready = _wait_ready(jd, own, addresses, ports, rt, deadline)
        rt.step("ready")
        if channel is not None:
            _create_channel(job, *channel, rt, place)
            rt.step("channel_created")
    except OSError as exc:  # our own files: a full or read-only /run, a symlink where a directory belongs
        raise FileError(f"{exc.filename or 'file'}: {exc.strerror or exc}") from exc
    chan = str(channel[2]) if channel else ""
    return Setup(len(trays), chan, port=ports[0], cmd_port=ports[1], ready=ready.ready, blamed=tuple(ready.blamed))


def _setup_channel_only(
    job: JobContext, trays: tuple[str, ...], rt: Runtime, place: members.Place | None, deadline: float
) -> Setup:
    """``[policy] single_tray = channel``: the job's channel and its state, no daemon."""
    channel = _plan_channel(job, trays, place, rt, deadline)
    jd = rt.settings.paths.job(job.job_id)
    try:
        ensure_dir(jd.path, 0o755, private_from=rt.settings.paths.run_dir)
        minor, chan = (channel[1], str(channel[2])) if channel else (None, "")
        state = JobState(
            job.job_id, job.node, *job.owner, job.user, trays, (), 0, "none", minor, chan, rt.host.time(),
            restarts=job.restarts, start_time=job.start_time,
        )  # fmt: skip
        write_state(jd, state)
        if channel is not None:
            _create_channel(job, *channel, rt, place)
            rt.step("channel_created")
    except OSError as exc:
        raise FileError(f"{exc.filename or 'file'}: {exc.strerror or exc}") from exc
    return Setup(1, str(channel[2]) if channel else "", daemon=False)


def _resolve(job: JobContext, trays: tuple[str, ...], rt: Runtime) -> tuple[str, ...]:
    """Every tray's address by ``[resolve] method``; this tray's must be on one of its interfaces."""
    s = rt.settings
    table = None
    if s.resolve.method == "slurm_conf":
        from imexctl.slurm import nodeaddr

        table = nodeaddr.read(nodeaddr.conf_path(job.slurm_conf, s.paths.root))
    addresses = members.resolve_all(
        trays, method=s.resolve.method, host=rt.host, hosts_file=s.paths.hosts_file, node_addrs=table
    )
    rt.log.info(
        "imex.nodes.resolved", trays=list(trays), addresses=list(addresses), nodes_hash=imexconf.nodes_hash(addresses)
    )
    members.check_own(job.node, addresses[trays.index(job.node)], s.resolve.method, rt.host)
    return addresses


def _ports(job: JobContext, rt: Runtime) -> tuple[int, int]:
    """The job's ``SERVER_PORT`` and ``IMEX_CMD_PORT``, the same on every tray."""
    ports = rt.settings.ports
    return (imexconf.job_port(job.job_id, ports.server_port_range), imexconf.job_port(job.job_id, ports.cmd_port_range))


def _channel_place(trays: tuple[str, ...], source: BlockMap | None, run: _Run, rt: Runtime) -> members.Place | None:
    """Where the domain stands in its NVLink clique, for its channel; None when imexctl makes no channel.

    None with ``channels = none``, and when slurm.conf has
    ``SwitchType=switch/nvidia_imex``: that plugin gives each step its own
    channel in a private mount namespace and removes host channel nodes when
    slurmd starts, so a channel of imexctl's would be invisible to the job
    (design.md source slurm-switch-imex).  The clique is the topology
    source's (its blocks merged by ``[paths] topology_map``'s keys too), or
    without one slurm.conf's nodes.  Under slurmd (``SLURM_CONF`` given) a
    domain that has no place there (a tray slurm.conf does not list) is
    refused before anything starts: the job-id rule it would fall back to
    can meet a placed domain's number.  Outside slurmd (``imexctl demo``,
    the simulator) it gets the job-id rule.

    Raises:
        ConfigError: under slurmd, the domain has no place; the map cannot be read.
    """
    if rt.settings.policy.channels != "job":
        return None
    if run.slurm_channels:
        rt.log.info("imex.channels.slurm", reason="slurm.conf: SwitchType=switch/nvidia_imex owns the channels")
        return None
    slurm_conf = run.job.slurm_conf if run.job is not None else ""
    if source is not None:
        return members.channel_place(trays, source, None, members.load_map(rt.settings))
    names, why = None, f"no topology source, and slurm.conf {slurm_conf} could not be read"
    if run.conf is not None:
        from imexctl.slurm import nodeaddr

        try:
            names = nodeaddr.node_names(run.conf)
        except ConfigError as exc:
            why = f"no topology source, and {exc}"
    place = members.channel_place(trays, None, names)
    if place.unplaced and slurm_conf:
        raise ConfigError(
            f"the IMEX channel of this domain ({nodefold.fold(list(trays))}) has no place in its NVLink clique: "
            f"{why if names is None else place.unplaced}, and a number from the job id alone could be another "
            "domain's; refusing IMEX before starting anything: give [topology] source a topology file that names "
            "every tray (imexctl topology blocks), or list the trays in slurm.conf"
        )
    return place


def _plan_channel(
    job: JobContext, trays: tuple[str, ...], place: members.Place | None, rt: Runtime, deadline: float
) -> tuple[int, int, Path] | None:
    """``(major, minor, path)`` of the job's channel at ``place`` (None: imexctl makes no channel).

    Checked before anything starts: the driver must have channels, and the
    minor must lie below the driver's ``NVreg_ImexChannelCount``.  Then, still
    before the daemon starts (so its peers cannot form the domain either),
    the wait for a domain torn down here with the same number that may live
    on in the clique (``remnants.wait_gone``, until ``deadline``).

    Raises:
        DomainBusyError: such a domain outlived the deadline.
    """
    s, paths = rt.settings, rt.settings.paths
    if place is None:
        return None
    major = devices.read_major(paths.proc_devices)
    minor = devices.channel_minor(job.job_id, s.policy.channel_count, place.position, place.trays)
    devices.check_minor(minor, devices.driver_channel_count(paths.nvidia_params), s.policy.channel_count)
    remnants.wait_gone(job.job_id, minor, trays, rt, slurm_conf=job.slurm_conf, deadline=deadline)
    return major, minor, devices.channel_path(paths.channel_dir, minor)


def _write_files(
    job: JobContext,
    trays: tuple[str, ...],
    addresses: tuple[str, ...],
    ports: tuple[int, int],
    channel: tuple[int, int, Path] | None,
    rt: Runtime,
) -> JobDir:
    """The nodes file, the complete config.cfg, then state.json (so teardown finds the channel)."""
    s, jd = rt.settings, rt.settings.paths.job(job.job_id)
    own = addresses[trays.index(job.node)]
    ensure_dir(jd.path, 0o755, private_from=s.paths.run_dir)
    atomic_write(jd.nodes, imexconf.render_nodes(addresses), mode=0o644)
    ensure_dir(s.paths.imex_log_file.parent)
    text = imexconf.render_config(
        job_id=job.job_id,
        port=ports[0],
        cmd_port=ports[1],
        bind_ip=own,
        nodes_path=jd.nodes,
        log_file=s.paths.imex_log_file,
        overrides=s.imex,
        auth=peerauth.config_values(s.auth, s.paths.root),
    )
    atomic_write(jd.config, text, mode=0o644)
    rt.log.info("imex.config.written", config=str(jd.config), nodes=str(jd.nodes))
    minor, chan = (channel[1], str(channel[2])) if channel else (None, "")
    write_state(
        jd,
        JobState(
            job.job_id,
            job.node,
            *job.owner,
            job.user,
            trays,
            addresses,
            ports[0],
            s.daemon.backend,
            minor,
            chan,
            rt.host.time(),
            ports[1],
            restarts=job.restarts,
            start_time=job.start_time,
        ),
    )
    return jd


def _start(jd: JobDir, own: str, ports: tuple[int, int], rt: Runtime) -> None:
    """Refuse ports that are taken, naming who holds them, then start the daemon through the backend.

    Only an IMEX daemon in the way is ``domain_busy`` (a stale daemon); any
    other holder, a local user's process above all, is ``port_held`` and named
    by pid, uid and command (``hooks.portholder``, read only on this path).
    """
    for key, port in zip(("SERVER_PORT", "IMEX_CMD_PORT"), ports):
        if rt.host.port_in_use(own, port):
            from imexctl.hooks import portholder

            raise portholder.refusal(key, own, port, rt)
    daemon.make_backend(rt.host, rt.settings).start(jd)
    rt.log.info("imex.daemon.started", backend=rt.settings.daemon.backend, port=ports[0], cmd_port=ports[1])


def _wait_ready(
    jd: JobDir, own: str, addresses: tuple[str, ...], ports: tuple[int, int], rt: Runtime, deadline: float
) -> Any:
    from imexctl.hooks import readiness

    alive = _alive_check(rt.host, rt.settings, jd)
    probe = readiness.Probe(jd.config, own, addresses, rt.settings.readiness.level, alive, ports[1], ports[0])
    ready = readiness.wait_ready(rt.host, rt.settings, probe, deadline=deadline, log=rt.log)
    if ready.blamed:
        rt.log.warning("imex.peer_blamed", peers=list(ready.blamed), status=ready.status)
    return ready


def _alive_check(host: Host, settings: Settings, jd: JobDir) -> Callable[[], bool]:
    """Whether the job's daemon still runs: a process-table scan until one shows it, then cheap pid checks.

    Until a scan shows the daemon, the backend's own record decides: the
    process the exec backend started (``daemon.pid``; its pid stays across an
    exec), or the unit's state under systemd.  A daemon started through a
    program that execs it (a site's wrapper script; the lab's ``/bin/sh``
    launcher) shows no command line for a moment during that exec, and a scan
    that falls into it finds nothing: under load in CI a prolog took a daemon
    that was starting for one that had exited, and failed its tray.
    """
    known: list[ProcInfo] = []

    def alive() -> bool:
        if known:
            return any(host.is_alive(p) for p in known)
        known.extend(daemon.job_processes(host, settings, jd.config))
        # the one rule (daemon.daemon_runs); here a backend that cannot be asked gives no word that it runs
        return daemon.daemon_runs(host, settings, jd, found=known) is True

    return alive


def _create_channel(
    job: JobContext, major: int, minor: int, path: Path, rt: Runtime, place: members.Place | None
) -> None:
    devices.ensure_channel_dir(path.parent)
    if devices.remove_channel(path, minor):
        rt.log.warning("device.channel.removed", path=str(path), reason="stale node of an earlier job")
    mode = rt.settings.policy.channel_mode
    uid, gid = job.owner
    rt.host.mknod_char(path, major, minor, mode=mode, uid=uid, gid=gid)
    where = {"clique": place.clique, "position": place.position, "clique_trays": place.trays} if place else {}
    rt.log.info(
        "device.channel.created", path=str(path), major=major, minor=minor, uid=uid, mode=f"{mode:04o}", **where
    )
    others = [str(c.path) for c in devices.list_channels(path.parent) if c.minor != minor]
    if others:
        rt.log.warning("device.channel.foreign", channels=others)


def _mark_set_up(job: JobContext, rt: Runtime) -> None:
    """Record that the domain is set up: from now on ``cleanup`` treats the job as running (``jobs.still_runs``)."""
    try:
        mark_state(rt.settings.paths.job(job.job_id), set_up=rt.host.time())
    except OSError as exc:
        raise FileError(f"{exc.filename or 'state.json'}: {exc.strerror or exc}") from exc


def _rollback(job_id: int, rt: Runtime, exc: BaseException) -> None:
    """Undo this prolog; if that fails too the node is unsafe and says so (exit 70)."""
    try:
        actions = teardown(job_id, rt)
    except ImexctlError as again:
        rt.log.error("prolog.rolled_back", ok=False, error=str(again))
        raise UnsafeNodeError(f"{exc}; rollback failed too: {again}") from exc
    rt.log.warning("prolog.rolled_back", actions=texts(actions))
