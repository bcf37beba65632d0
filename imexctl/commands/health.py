"""``imexctl health``: is this tray fit for the next job, judged in about a second, for Slurm's HealthCheckProgram.

It judges only faults of the tray (docs/operations.md "In a node health check"):

- a daemon of a job that no longer runs here, or an IMEX daemon of no job
  (``stale_daemon``, ``stray_daemon``), judged only while it holds the node
  lock, which it tries once and never waits for: a prolog or epilog that holds
  it is in progress, healthy for now;
- the stock ``nvidia-imex.service`` running (``stock_unit``);
- NVML: the fabric failed, or is unhealthy (``gpu_failed``; ``fabric = nvml``);
- the driver's own record that it refuses fabric allocations after an IMEX
  daemon ended with exports left (``imex_shutdown``; the lines, and what the
  driver does after each: :mod:`imexctl.imex.driverlog`), read from
  ``/dev/kmsg`` after the sequence number it keeps in ``<run_dir>/health.kmsg``;
- a config file that does not load (``config_invalid``), or a node lock the
  hooks would refuse (``file_failed``).

"Idle, no daemon" is healthy.  Unless ``--check-only``, it then makes Slurm
agree: it drains the node with a reason of its own prefix
(``imexh:<code> <node>: ...``, :mod:`imexctl.slurm.drain`), and resumes only a
node whose reason holds one of its own, found by that prefix wherever a tag
another tool added leaves it (or by the ``imex-health:`` of earlier
versions), once the fault is gone (never for ``imex_shutdown``:
:data:`~imexctl.imex.driverlog.RESUME`).  It asks
slurmctld (``scontrol show node``) only when slurmd did not say what
slurmctld thinks (``SLURM_NODE_IS_HEALTHY``) and the answer matters; an
admin's or a hook's reason is never replaced.

The driver's line is evidence that a later run may still need: health keeps
it in ``health.kmsg`` (pending, whatever happens to the kernel's ring buffer)
until Slurm holds it (a drain of ours for ``imex_shutdown`` took, or the node
already has one) or an admin acknowledges it (``--acknowledge``, for NHC,
which drains and resumes by its own rule).  A ``--check-only`` run never
lets it go.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from imexctl.imex.driverlog import RESUME
from imexctl.platform import Record

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from pathlib import Path

    from imexctl.gpu.fabric import Gpu
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject
    from imexctl.slurm.drain import Ours
    from imexctl.slurm.node import NodeView

__all__ = [
    "AUTO_RESUME",
    "CODES",
    "PREFIX",
    "SHUTDOWN",
    "Cursor",
    "Finding",
    "KernelLog",
    "Report",
    "Sighting",
    "SlurmDone",
    "Verdict",
    "command",
    "judge",
    "reason_of",
    "render_gauges",
    "write_gauges",
]

#: the start of every reason ``imexctl health`` gives a node (``slurm.drain.HEALTH``); the hooks' is ``imex:``
PREFIX: Final = "imexh:"
#: every finding's code, with the fix it prints (docs/troubleshooting.md has a section for each)
CODES: Final = {
    "stale_daemon": "imexctl cleanup (imexctl cleanup --dry-run shows what it removes)",
    "stray_daemon": "stop it (imexctl status shows it); no imexctl command started it",
    "stock_unit": "systemctl disable --now nvidia-imex.service && systemctl mask nvidia-imex.service",
    "gpu_failed": "check the NVLink fabric (nvidia-smi -q -d FABRIC) and the GPU",
    "imex_shutdown": f"{RESUME} (scontrol update nodename=<node> state=resume; NHC: imexctl health --acknowledge)",
    "config_invalid": "correct the config file: every prolog here exits 78 until then",
    "file_failed": "remove the node lock file; the hooks refuse it too",
}
#: the finding of the driver's own line that it refuses fabric allocations (design.md source imex-abrupt-shutdown)
SHUTDOWN: Final = "imex_shutdown"
#: faults that health clears by itself (resume) once they are gone; the others wait for an admin's resume
AUTO_RESUME: Final = frozenset(CODES) - {SHUTDOWN}
_SYSTEMCTL_TIMEOUT_S: Final = 5.0
_KMSG_CURSOR: Final = "health.kmsg"


class Finding(Record):
    """One fault of the tray: a code of :data:`CODES`, the evidence."""

    code: str
    message: str

    def data(self) -> JsonObject:
        """The ``--json`` form."""
        return {
            "code": self.code,
            "message": self.message,
            "fix": CODES[self.code],
            "resume": "auto" if self.code in AUTO_RESUME else "admin",
        }


class Sighting(Record):
    """The driver's lines that it refuses fabric allocations, read and not yet handed on: how many, the last."""

    times: int
    boot: str
    seq: int
    usec: int


class KernelLog(Record):
    """``<run_dir>/health.kmsg``: the kernel log of boot ``boot`` read up to ``seq``, and the evidence pending."""

    boot: str
    seq: int
    pending: Sighting | None

    def text(self) -> str:
        """The file: ``BOOT SEQ``, then ``imex_shutdown COUNT BOOT SEQ USEC`` while evidence is pending."""
        p = self.pending
        kept = "" if p is None else f"{SHUTDOWN} {p.times} {p.boot or '-'} {p.seq} {p.usec}\n"
        return f"{self.boot} {self.seq}\n{kept}"


class Cursor(Record):
    """Where health keeps the kernel log's position and evidence, the text it read there, what it keeps now."""

    path: Path
    was: str
    now: KernelLog


class Verdict(Record):
    """What health found on the tray: its faults, and whether a hook was in flight (not judged).

    ``kernel``: the kernel log's position and pending evidence, to keep once
    Slurm has been made to agree (None where the kernel log was not judged).
    """

    node: str
    findings: tuple[Finding, ...]
    in_progress: bool
    idle: bool
    notes: tuple[str, ...]
    kernel: Cursor | None = None

    @property
    def healthy(self) -> bool:
        """No fault found (a hook in flight is healthy for now)."""
        return not self.findings


# ---------------------------------------------------------------- judging


def judge(rt: Runtime, node: str, *, config_problem: str = "") -> Verdict:
    """Every check, each bounded; a check that cannot look (no systemd, no kernel log) finds nothing."""
    from imexctl.platform.errors import FileError

    if config_problem:  # the other checks would read the built-in paths, maybe not this site's
        return Verdict(node, (Finding("config_invalid", config_problem),), False, False, ("other checks not run",))
    findings: list[Finding] = []
    notes: list[str] = []
    in_progress, idle = False, True
    root = rt.host.euid() == 0
    if not root:  # the node lock, the job directories and the kernel log's position are root's
        notes.append(f"jobs and kernel log not judged as uid {rt.host.euid()}: run imexctl health as root")
    else:
        try:
            found, in_progress, idle = _daemons(rt)
            findings += found
        except FileError as exc:  # a node lock (or run directory) the hooks would refuse
            findings.append(Finding("file_failed", str(exc)))
    findings += _stock_unit(rt, notes)
    findings += _fabric(rt, node)
    cursor = _kernel(rt, notes) if root else None
    if cursor is not None and cursor.now.pending is not None:
        findings.append(Finding(SHUTDOWN, _evidence(cursor.now)))
    # a fault that waits for an admin leads: the reason Slurm keeps names it, and no resume of ours clears it
    findings.sort(key=lambda f: f.code in AUTO_RESUME)
    return Verdict(node, tuple(findings), in_progress, idle, tuple(notes), cursor)


def _daemons(rt: Runtime) -> tuple[list[Finding], bool, bool]:
    """Daemons of gone jobs and strays, under the node lock; ``(findings, in progress, idle)``.

    Whether a gone job's daemon runs is the one rule (``daemon.daemon_runs``,
    through ``jobs.daemon_left``): a daemon that ``/proc`` misses but its
    backend says runs is stale too.  A job whose epilog may still be working
    (``jobs.epilog_pending``: the deadline it recorded) is in flight.
    """
    from imexctl.hooks.jobs import daemon_left, epilog_pending, scan_jobs, still_runs
    from imexctl.hooks.state import hooks_idle, read_state

    out: list[Finding] = []
    with hooks_idle(rt.settings.paths.lock_file) as free:
        if not free:
            return out, True, False
        jobs, strays = scan_jobs(rt)
        pending = False
        for job_id in jobs:
            if still_runs(job_id, rt).runs:
                continue
            if epilog_pending(job_id, rt):  # its epilog began and may still be working: in flight
                pending = True
                continue
            left = daemon_left(job_id, rt, read_state(rt.settings.paths.job(job_id)))
            if left:
                out.append(Finding("stale_daemon", f"IMEX {left} of job {job_id}, which no longer runs here"))
        where = rt.settings.paths.jobs_dir
        out += [Finding("stray_daemon", f"IMEX daemon pid {p.pid} under {where} of no job") for p in strays]
    return out, pending, not jobs


def _stock_unit(rt: Runtime, notes: list[str]) -> list[Finding]:
    """NVIDIA's domain-wide unit active: every prolog refuses to start a job's daemon beside it."""
    from imexctl.imex.daemon import parse_systemctl_show
    from imexctl.platform.errors import CommandError

    unit = rt.settings.daemon.stock_unit
    argv = (rt.settings.commands.systemctl, "show", "--property=Id,LoadState,ActiveState", "--", unit)
    try:
        done = rt.host.run(argv, timeout_s=_SYSTEMCTL_TIMEOUT_S)
    except CommandError as exc:
        notes.append(f"{unit}: systemd not asked: {exc}")
        return []
    state = parse_systemctl_show(done.stdout).get(unit, {}).get("ActiveState", "")
    if done.returncode != 0 or not state:
        notes.append(f"{unit}: systemd did not say (exit {done.returncode})")
        return []
    if state in ("active", "activating", "reloading"):
        return [Finding("stock_unit", f"{unit} is {state}: it runs one domain-wide daemon, no job's can start")]
    return []


def _fabric(rt: Runtime, node: str) -> list[Finding]:
    """NVML, as the prolog asks it (``fabric = nvml``): failed, registration failed, unhealthy."""
    s = rt.settings
    if s.policy.fabric != "nvml":
        return []
    from imexctl.gpu.topology import read_tray

    tray = read_tray(rt.gpu, node)
    if tray.error and not tray.gpus:  # NVML itself failed
        return [Finding("gpu_failed", f"NVML: {tray.error}")]
    bad, pending = [], False
    for g in tray.gpus:
        if g.state in ("NOT_STARTED", "IN_PROGRESS"):  # registering (after a boot): the prolog waits for it
            pending = True
            continue
        if g.status is None:  # no fabric on this GPU
            continue
        summary = g.health_summary
        if (
            g.state != "COMPLETED"
            or not g.status.startswith("NVML_SUCCESS")
            or summary == "UNHEALTHY"
            or (summary == "LIMITED_CAPACITY" and s.policy.fabric_limited == "refuse")
        ):
            bad.append(f"GPU {g.gpu}: state {g.state}, {g.status.split(' (')[0]}, {g.health or '-'}")
    if bad:
        return [Finding("gpu_failed", "NVLink fabric: " + "; ".join(bad))]
    if tray.error and not pending:  # the GPUs disagree (several cliques, ...)
        return [Finding("gpu_failed", f"NVML: {tray.error}")]
    return []


def _kernel(rt: Runtime, notes: list[str]) -> Cursor:
    """The driver's own lines since the last check (this boot), added to the evidence still pending.

    Only the driver's record counts (:func:`imexctl.imex.driverlog.sentence_of`):
    its line that it refuses fabric allocations becomes pending evidence; its
    line that it stopped the processes holding imported memory is a note.
    Nothing is written here: :func:`_keep_kernel` does, once Slurm was asked.
    """
    from imexctl.imex import driverlog
    from imexctl.platform import kmsg

    paths = rt.settings.paths
    path = paths.run_dir / _KMSG_CURSOR
    boot = _read(paths.root / "proc/sys/kernel/random/boot_id").strip()
    was = _read_cursor(path, notes)
    kept = _parse_cursor(was, boot)
    try:
        records, last = kmsg.read_after(str(paths.root / "dev/kmsg"), kept.seq)
    except OSError as exc:
        notes.append(f"kernel log not read: {exc.strerror or exc}")
        return Cursor(path, was, kept)
    lines: dict[str, list[kmsg.Entry]] = {driverlog.DISABLED: [], driverlog.RECOVERY: []}
    for entry in records:
        sentence = driverlog.sentence_of(entry.facility, entry.message)
        if sentence:
            lines[sentence].append(entry)
    pending = kept.pending
    if hits := lines[driverlog.DISABLED]:
        pending = Sighting((pending.times if pending else 0) + len(hits), boot, hits[-1].seq, hits[-1].usec)
    if stopped := lines[driverlog.RECOVERY]:
        what = f"'{driverlog.RECOVERY}' ({len(stopped)}x, last kmsg seq {stopped[-1].seq})"
        notes.append(f"kernel: {what}: {driverlog.AFTER_RECOVERY}; no fault of the tray")
    return Cursor(path, was, KernelLog(boot, last, pending))


def _evidence(log: KernelLog) -> str:
    """The finding's message for the pending evidence of ``log``."""
    from imexctl.imex import driverlog

    p = log.pending
    assert p is not None
    if p.seq < 0:  # a pending line whose details the file no longer holds: still evidence
        when = "details unreadable in health.kmsg"
    else:
        at = f"{p.usec // 1_000_000} s after boot" if p.boot == log.boot else "an earlier boot"
        when = f"{p.times}x, last kmsg seq {p.seq}, {at}"
    return f"kernel: '{driverlog.DISABLED}' ({when}): {driverlog.AFTER_DISABLED}"


def _parse_cursor(text: str, boot: str) -> KernelLog:
    """What ``health.kmsg`` holds: the position, and the pending evidence.

    The position counts only for this boot (else -1: read from the start);
    the evidence of any boot stays, and a pending line that cannot be parsed
    stays pending.
    """
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    seq = int(head[1]) if len(head) == 2 and head[0] == boot and head[1].isdigit() else -1
    pending = None
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] == SHUTDOWN:
            numbers = [fields[i] for i in (1, 3, 4)] if len(fields) == 5 else []
            if numbers and all(n.isascii() and n.isdigit() for n in numbers):
                pending = Sighting(int(fields[1]), fields[2], int(fields[3]), int(fields[4]))
            else:
                pending = Sighting(1, "", -1, -1)
    return KernelLog(boot, seq, pending)


def _read_cursor(path: Path, notes: list[str]) -> str:
    """``health.kmsg``'s text: '' when there is none; a file that is not root's own regular file is refused."""
    from imexctl.platform.fsutil import read_text_nofollow

    try:
        return read_text_nofollow(path, trusted=True)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        notes.append(f"kernel log position not read from {path}: {exc.strerror or exc}")
        return ""


def _slurm_holds(verdict: Verdict, done: SlurmDone | None) -> bool:
    """Whether Slurm now keeps the node out of service for the kernel's evidence: a reason of ours with its code.

    Our drain took with it (it leads the reason), or the node already had
    such a reason.  Out of service for anyone else's reason, or a drain that
    failed, holds nothing: the evidence stays pending for the next run.
    """
    if done is None:
        return False
    if done.action == "drained":
        return bool(verdict.findings) and verdict.findings[0].code == SHUTDOWN
    return done.action == "kept" and _ours(done.reason or "") == SHUTDOWN


def _keep_kernel(verdict: Verdict, done: SlurmDone | None, *, acknowledged: bool = False) -> Verdict:
    """Write the kernel log's position and what evidence is still pending; a note when it cannot be kept.

    The evidence is let go once Slurm holds it or an admin acknowledged it;
    otherwise (``--check-only``, a failed drain, a node out of service for
    another reason) it stays pending.  The file is written only when it
    changes.
    """
    cursor = verdict.kernel
    if cursor is None:
        return verdict
    now = cursor.now
    if now.pending is not None and (acknowledged or _slurm_holds(verdict, done)):
        now = now._replace(pending=None)
    text = now.text()
    if text == cursor.was or (not cursor.was and now == KernelLog(now.boot, -1, None)):  # nothing read, none kept
        return verdict
    notes = list(verdict.notes)
    _remember(cursor.path, text, notes)
    return verdict._replace(notes=tuple(notes), kernel=cursor._replace(now=now))


def _read(path: Any) -> str:
    from imexctl.platform.fsutil import read_text_nofollow

    try:
        return read_text_nofollow(path)
    except OSError:
        return ""


def _remember(cursor: Any, text: str, notes: list[str]) -> None:
    from imexctl.platform.fsutil import atomic_write, ensure_dir

    try:
        ensure_dir(cursor.parent, 0o755, private_from=cursor.parent)
        atomic_write(cursor, text, mode=0o600)
    except OSError as exc:
        notes.append(f"cannot keep the kernel log position in {cursor}: {exc.strerror or exc}")


# ---------------------------------------------------------------- Slurm


def reason_of(verdict: Verdict) -> str:
    """The node reason for the findings: ``imexh:<code> <node>: <message>``, the first finding first, 255 bytes.

    ``(+N more)`` for the other findings stays whole when the message is cut.
    """
    from imexctl.slurm import drain

    first = verdict.findings[0]
    more = f"(+{len(verdict.findings) - 1} more)" if len(verdict.findings) > 1 else ""
    return drain.reason(first.code, verdict.node, first.message, prefix=PREFIX, suffix=more)


def _own(reason: str) -> Ours | None:
    """Health's own reason in a node's reason, wherever a tag left it (``slurm.drain.parse``); None for others'."""
    from imexctl.slurm import drain

    return drain.parse(reason, (drain.HEALTH, drain.LEGACY_HEALTH))


def _ours(reason: str) -> str:
    """The finding code of a reason of ours ('' for anyone else's)."""
    own = _own(reason)
    return own.code if own is not None else ""


def _same(own: Ours, want: str) -> bool:
    """Whether the drain of ours says what health would say now: code, node and message, tags aside."""
    now = _own(want)
    return now is not None and (own.code, own.node) == (now.code, now.node) and own.detail.startswith(now.detail)


class SlurmDone(Record):
    """What health asked of Slurm and did there: drain, resume or nothing, and why."""

    #: ``SLURM_NODE_IS_HEALTHY`` as slurmd gave it (``yes``, ``no``), None when it did not
    node_is_healthy: str | None
    #: slurmctld was asked (``scontrol show node``); its answer's state and reason
    asked: bool
    state: str | None
    reason: str | None
    #: ``none``, ``kept``, ``skipped``, ``drained``, ``resumed`` or ``failed``
    action: str
    detail: str

    def data(self) -> JsonObject:
        """The ``slurm`` object of ``health --json``."""
        return self._asdict()


def reconcile(verdict: Verdict, env: Mapping[str, str], rt: Runtime) -> SlurmDone:
    """Make Slurm agree with the verdict: drain, resume or nothing; what was asked and done.

    ``SLURM_NODE_IS_HEALTHY`` (slurmd 26.05.3 with ``health_check_report``,
    the default from 26.11; design.md source slurm-healthcheck) says whether slurmctld keeps the node out of
    service.  Where it is given, slurmctld is asked only when the node is
    out of service and now healthy (is it ours to resume?).  A node that is
    out of service for someone else's reason keeps it.
    """
    from imexctl import slurm as var
    from imexctl.slurm import node as slurmnode

    given = var.value(env, var.HEALTHY).strip().lower()
    known = given if given in ("yes", "no") else None
    out = SlurmDone(known, False, None, None, "none", "")
    # the kernel's evidence is let go only once Slurm holds it: out of service, but for whose reason?
    evidence = any(f.code == SHUTDOWN for f in verdict.findings)
    if verdict.healthy and known == "yes":
        return out._replace(detail="healthy, and in service")
    if not verdict.healthy and known == "no" and not evidence:
        return out._replace(action="kept", detail="already out of service (SLURM_NODE_IS_HEALTHY=no): reason kept")
    if verdict.healthy and verdict.in_progress:
        return out._replace(detail="a hook is in progress: judged on the next run")
    view: NodeView | None = None
    if known is None or known == "no":
        view = slurmnode.show_node(verdict.node, rt.host, rt.settings, var.value(env, var.CONF))
        out = out._replace(asked=True)
        if view is None:
            return out._replace(action="skipped", detail=f"slurmctld did not describe node {verdict.node}")
        out = out._replace(state="+".join(view.state), reason=view.reason)
    conf = var.value(env, var.CONF)
    if not verdict.healthy:
        action, detail = _drain(verdict, view, rt, conf)
    else:
        assert view is not None  # healthy and not known to be in service: asked above
        action, detail = _resume(verdict.node, view, rt, conf)
    return out._replace(action=action, detail=detail)


def _drain(verdict: Verdict, view: NodeView | None, rt: Runtime, conf: str) -> tuple[str, str]:
    """Drain for the findings, unless the node is out of service for someone else or for this very reason."""
    from imexctl.slurm import node as slurmnode

    want = reason_of(verdict)
    if view is not None and slurmnode.unhealthy_state(view.state):
        own = _own(view.reason) if view.drained else None
        if own is None or _same(own, slurmnode.clean_reason(want)):  # ours with other findings: updated
            return "kept", "already out of service: reason kept"
    failed = slurmnode.drain(verdict.node, want, rt.host, rt.settings, conf)
    if failed:
        return "failed", f"drain: {failed}"
    return "drained", slurmnode.clean_reason(want)


def _resume(node: str, view: NodeView, rt: Runtime, conf: str) -> tuple[str, str]:
    """Resume a node drained by health, for a fault that health clears by itself."""
    from imexctl.slurm import node as slurmnode

    code = _ours(view.reason)
    if not view.drained or not code:
        return "none", "in service" if not slurmnode.unhealthy_state(
            view.state
        ) else "out of service for another reason"
    if code not in AUTO_RESUME:
        return "kept", f"drained for {code}: an admin resumes it"
    failed = slurmnode.resume(node, rt.host, rt.settings, conf)
    if failed:
        return "failed", f"resume: {failed}"
    return "resumed", f"the fault ({code}) is gone"


class Report(Record):
    """One ``imexctl health`` run: the verdict and, unless judging only or not root, what Slurm was made to do.

    ``acknowledged``: with ``--acknowledge``, the evidence the admin let go
    (no longer among the verdict's findings).
    """

    verdict: Verdict
    slurm: SlurmDone | None
    acknowledged: tuple[Finding, ...] = ()

    def data(self) -> JsonObject:
        """``health --json``'s ``data``."""
        v = self.verdict
        return {
            "node": v.node,
            "healthy": v.healthy,
            "in_progress": v.in_progress,
            "idle": v.idle,
            "findings": [f.data() for f in v.findings],
            "notes": list(v.notes),
            "slurm": self.slurm.data() if self.slurm is not None else None,
            "acknowledged": [f.data() for f in self.acknowledged],
        }


# ---------------------------------------------------------------- the command


def render_text(verdict: Verdict, slurm: SlurmDone | None, acknowledged: tuple[Finding, ...] = ()) -> str:
    """The first line is the verdict (NHC's check reads it); one line per finding with its fix; Slurm's line.

    With ``--acknowledge``, a line for each piece of evidence let go, after the findings.
    """
    if verdict.healthy:
        why = (
            "a prolog or epilog is in progress"
            if verdict.in_progress
            else "idle, no IMEX daemon"
            if verdict.idle
            else "the jobs' domains run"
        )
        lines = [f"healthy {verdict.node}: {why}"]
    else:
        first = verdict.findings[0]
        lines = [f"unhealthy {verdict.node}: {first.code}: {first.message}"]
        lines += [f"unhealthy {verdict.node}: {f.code}: {f.message}" for f in verdict.findings[1:]]
        lines += [f"  fix {f.code}: {CODES[f.code]} (docs/troubleshooting.md#{f.code})" for f in verdict.findings]
    lines += [f"acknowledged {verdict.node}: {f.code}: {f.message}" for f in acknowledged]
    lines += [f"  note: {n}" for n in verdict.notes]
    if slurm is not None:
        if slurm.asked and slurm.state:
            lines.append(f"slurm: {verdict.node} is {slurm.state}" + (f": {slurm.reason}" if slurm.reason else ""))
        lines.append(f"slurm: {slurm.action}: {slurm.detail}")
    return "\n".join(_printable(line) for line in lines) + "\n"


def _printable(text: str) -> str:
    """``text`` with every non-printing character escaped: a reason read back from Slurm is someone's text."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, gpu: Gpu | None) -> int:
    """``imexctl health``: exit 0 healthy (or a hook in progress), 1 with a fault of the tray."""
    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import TrayUnhealthy

    # the file the hooks read under slurmd (issue 23); a config that does not load names no log file: stderr only;
    # stdout says it all, the structured line goes to the log file (-v: stderr too); NVML only with fabric = nvml
    needs = Needs(logs="hook", gpu="policy", config="lenient", quiet=True)
    built = build("health", env, needs, config=args.config, verbose=args.verbose, node=args.node, host=host, gpu=gpu)
    rt, node, problem = built.rt, built.node, built.problem
    rt.log.bind_context(node=node)
    root = rt.host.euid() == 0
    if args.acknowledge and not root:
        from imexctl.platform.errors import NotPrivilegedError

        raise NotPrivilegedError("imexctl health --acknowledge keeps its record in root's run directory: run as root")
    verdict = judge(rt, node, config_problem=problem)
    acknowledged: tuple[Finding, ...] = ()
    if args.acknowledge:
        verdict, acknowledged = _acknowledge(verdict)
    judge_only = args.check_only or args.acknowledge or not root
    slurm_done = None if judge_only else reconcile(verdict, env, rt)
    verdict = _keep_kernel(verdict, slurm_done, acknowledged=bool(acknowledged))
    _log(rt, verdict, slurm_done, acknowledged)
    if root:
        write_gauges(rt, verdict, config_problem=problem)
    _print(args, Report(verdict, slurm_done, acknowledged))
    return 0 if verdict.healthy else int(TrayUnhealthy.exit_code)


def _acknowledge(verdict: Verdict) -> tuple[Verdict, tuple[Finding, ...]]:
    """The verdict without the kernel's pending evidence, and that evidence (the admin's ``--acknowledge``)."""
    taken = tuple(f for f in verdict.findings if f.code == SHUTDOWN)
    if not taken:
        return verdict._replace(notes=(*verdict.notes, "nothing to acknowledge: no kernel evidence is pending")), ()
    rest = tuple(f for f in verdict.findings if f.code != SHUTDOWN)
    return verdict._replace(findings=rest), taken


def _print(args: argparse.Namespace, report: Report) -> None:
    if not args.json:
        sys.stdout.write(render_text(report.verdict, report.slurm, report.acknowledged))
        return
    from imexctl.platform.errors import TrayUnhealthy
    from imexctl.platform.output import print_json

    healthy = report.verdict.healthy
    print_json(report, errors=[] if healthy else [TrayUnhealthy(reason_of(report.verdict))])


def _log(rt: Runtime, verdict: Verdict, slurm_done: SlurmDone | None, acknowledged: tuple[Finding, ...]) -> None:
    """One ``health.done`` line when a fault was found or Slurm was changed; a healthy idle run logs nothing.

    ``health.acknowledged`` names the evidence an admin let go.
    """
    if acknowledged:
        rt.log.info("health.acknowledged", findings=[f"{f.code}: {f.message}" for f in acknowledged])
    action, detail = (slurm_done.action, slurm_done.detail) if slurm_done is not None else ("none", "")
    if verdict.healthy and action in ("none", "skipped"):
        return
    findings = [f"{f.code}: {f.message}" for f in verdict.findings]
    fields = {"ok": verdict.healthy, "findings": findings, "slurm": action, "detail": detail}
    if action == "failed":
        rt.log.error("health.done", **fields)
    elif verdict.healthy:
        rt.log.info("health.done", **fields)
    else:
        rt.log.warning("health.done", **fields)


# ---------------------------------------------------------------- the gauges

#: the file of health's gauges in ``[metrics] textfile_dir``, beside the hooks' and the live ones (docs/metrics.md)
GAUGES_FILE: Final = "imexctl-health.prom"
#: name -> (type, help); docs/metrics.md lists exactly these (tests/commands/test_health_gauges.py)
GAUGES: Final[dict[str, tuple[str, str]]] = {
    "imexctl_health_finding": ("gauge", "imexctl health's last verdict, by finding code: 1 found, 0 not."),
    "imexctl_health_run_timestamp_seconds": ("gauge", "When imexctl health last judged this tray (Unix time)."),
}


def render_gauges(verdict: Verdict, now: float, block: str) -> str:
    """The text of ``imexctl-health.prom``: one ``imexctl_health_finding`` per code of :data:`CODES`, and when."""
    from imexctl.hooks.metrics import with_block

    found = {f.code for f in verdict.findings}
    finding, when = GAUGES
    lines = [f"# HELP {finding} {GAUGES[finding][1]}", f"# TYPE {finding} {GAUGES[finding][0]}"]
    lines += [f'{finding}{{code="{code}"}} {int(code in found)}' for code in CODES]
    lines += [f"# HELP {when} {GAUGES[when][1]}", f"# TYPE {when} {GAUGES[when][0]}", f"{when} {round(now, 3)!r}"]
    return "\n".join(with_block(lines, block)) + "\n"


def write_gauges(rt: Runtime, verdict: Verdict, *, config_problem: str = "") -> Path | None:
    """Replace ``<textfile_dir>/imexctl-health.prom`` with the verdict's gauges; the file, None when metrics are off.

    A config file that does not load (``config_problem``) is itself a
    finding: its gauges go where the hooks then count their failures
    (``metrics.fallback``).  The block is the tray's in the topology source,
    else the one the hooks' totals remember.  A file that cannot be written
    is a warning (``metrics.failed``), never the check's verdict.
    """
    from imexctl.hooks import metrics
    from imexctl.platform.fsutil import atomic_write

    settings = metrics.fallback(verdict.node) if config_problem else rt.settings
    directory = settings.metrics.textfile_dir if settings is not None else ""
    if settings is None or not directory:
        return None
    target = settings.paths.root / directory.lstrip("/") / GAUGES_FILE
    try:
        block = metrics.tray_block(settings, verdict.node) or metrics.remembered(settings)[1]
        metrics.check_textfile_dir(target.parent)
        atomic_write(target, render_gauges(verdict, rt.host.time(), block), mode=0o644)
    except OSError as exc:
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")
        return None
    return target
