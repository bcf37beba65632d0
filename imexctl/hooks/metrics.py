"""Prometheus metrics for node_exporter's textfile collector, written by hand (docs/metrics.md).

After each prolog, epilog and cleanup (``[metrics] textfile_dir`` set), the
totals kept in ``<run_dir>/metrics.json`` are updated under a lock of their
own and ``<textfile_dir>/imexctl.prom`` is replaced atomically.  The text
exposition format is written here rather than by ``prometheus_client``: that
library adds 50-90 ms of imports to every prolog, which is on every job's
critical path, and it has no way to carry counters from one short-lived
process to the next (docs/design.md).  The counters restart at zero after a
reboot (``run_dir`` is a tmpfs), which Prometheus' ``rate()`` handles.

A run whose config file does not load still counts, in the fallback
(:func:`fallback`): the built-in paths, and the ``textfile_dir`` that the
totals there remember from the last run that read a config (else
:data:`FALLBACK_TEXTFILE_DIR`), so that a bad config pushed to a rack shows as
counted ``config_invalid`` failures, with the block the totals remember.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Union

from imexctl import __version__
from imexctl.config.settings import Settings
from imexctl.hooks.results import Action, CleanupResult, EpilogResult, PrologResult
from imexctl.platform import Record
from imexctl.platform.fsutil import atomic_write, read_text_nofollow

__all__ = [
    "BUCKETS",
    "FALLBACK_ROOT",
    "FALLBACK_TEXTFILE_DIR",
    "FILE_NAME",
    "METRICS",
    "STATES",
    "Domain",
    "Run",
    "build_version",
    "check_textfile_dir",
    "fallback",
    "record",
    "remember",
    "remembered",
    "render",
    "run_of",
    "textfile",
    "tray_block",
    "with_block",
]

FILE_NAME: Final = "imexctl.prom"
STATE_FILE: Final = "metrics.json"
#: upper bounds (seconds) of the duration histograms: a skipped prolog takes tens of ms, a domain a few s
BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: values of the ``state`` label of imexctl_domain_state
STATES: Final = ("none", "up", "degraded", "down", "not_ready", "unknown")
_LOCK_WAIT_S: Final = 2.0
#: where a run whose config does not load finds the built-in paths (``[paths] root``; the tests' own root)
FALLBACK_ROOT = "/"
#: the textfile directory of such a run when the totals remember none: the one docs/metrics.md sets
FALLBACK_TEXTFILE_DIR: Final = "/var/lib/node_exporter/textfile_collector"
#: what a prolog, an epilog or cleanup returns
Result = Union[PrologResult, EpilogResult, CleanupResult]

#: name -> (type, help); docs/metrics.md lists exactly these (tests/hooks/test_metrics.py)
METRICS: Final[dict[str, tuple[str, str]]] = {
    "imexctl_hook_runs_total": ("counter", "Prolog and epilog runs by hook, outcome and error code."),
    "imexctl_cleanup_runs_total": ("counter", "imexctl cleanup runs (not --dry-run) by outcome."),
    "imexctl_cleanup_actions_total": ("counter", "What imexctl cleanup did, by action."),
    "imexctl_daemon_lost_total": ("counter", "Jobs whose IMEX daemon ended before the job, found by the epilog."),
    "imexctl_daemon_busy_stops_total": (
        "counter",
        "Job daemons the epilog stopped while the job user's processes still held the NVIDIA driver.",
    ),
    "imexctl_sharing_unknown_total": (
        "counter",
        "Prologs that got no answer from slurmctld whether the job may share its trays (Slurm 22.05): no domain.",
    ),
    "imexctl_hook_duration_seconds": ("histogram", "Run time of the prolog and the epilog, by hook."),
    "imexctl_time_to_ready_seconds": ("histogram", "From the prolog's start until the job's domain was ready."),
    "imexctl_domain_state": ("gauge", "This tray's IMEX domain: 1 for its current state, 0 for the others."),
    "imexctl_domain_peers": ("gauge", "Other trays in this tray's IMEX domain (0 without a domain)."),
    "imexctl_domain_peers_connected": ("gauge", "Peers this tray's daemon is connected to, where known."),
    "imexctl_domain_owner_job": ("gauge", "The job whose domain this tray runs (0: none)."),
    "imexctl_last_run_timestamp_seconds": ("gauge", "When imexctl last ran a hook or cleanup, by command."),
    "imexctl_build_info": ("gauge", "imexctl's version, as a label; always 1."),
}


class Domain(Record):
    """What the gauges say about this tray's domain."""

    owner_job: int = 0
    state: str = "none"
    peers: int = 0
    #: None where nobody asked the daemon (the sample is then left out)
    connected: int | None = None


class Run(Record):
    """One finished prolog, epilog or cleanup, as the metrics count it."""

    command: str
    outcome: str
    error_code: str = "none"
    duration_s: float = 0.0
    #: a prolog that made a domain ready: its time from start to ready
    ready_s: float | None = None
    #: what this run learned about the domain (a prolog that made one); None: see the job directory
    domain: Domain | None = None
    actions: tuple[str, ...] = ()
    #: an epilog: domains whose daemon had ended before the job
    lost: int = 0
    #: an epilog: daemons stopped while the job user's processes still held the NVIDIA driver
    busy: int = 0
    #: a prolog that skipped its job because slurmctld did not say whether it may share its trays
    sharing_unknown: int = 0
    #: this tray's block (the ``block`` label of every series), where the run learned it; '': keep the last
    block: str = ""


#: the ``action`` label of each kind of teardown action (docs/metrics.md); a note counts as the job's files
_LABELS: Final = {
    "stop_daemon": "stop_daemon",
    "remove_channel": "remove_channel",
    "remove_job_dir": "remove_job_dir",
    "remove_note": "remove_job_dir",
    "remove_stray_channel": "remove_stray_channel",
    "failed": "failed",
}


def run_of(command: str, result: Result | None, error: BaseException | None, duration_s: float, level: str) -> Run:
    """What one command's result (or error) counts as; ``level`` is ``[readiness] level``."""
    if error is not None:
        return Run(command, "failed", getattr(error, "code", "crashed"), duration_s, lost=getattr(error, "lost", 0))
    if isinstance(result, CleanupResult):
        return Run(command, "ok", actions=tuple(label for a in result.actions for label in _action_labels(a)))
    if isinstance(result, EpilogResult):
        return Run(command, "ok", duration_s=duration_s, lost=len(result.lost_daemon), busy=len(result.busy_stop))
    if not isinstance(result, PrologResult):
        return Run(command, "ok", duration_s=duration_s)
    if result.skipped or result.job_ended:
        outcome = "skipped" if result.skipped else "job_ended"
        return Run(command, outcome, duration_s=duration_s, sharing_unknown=int(result.sharing_unknown))
    setup = result.setup
    if setup is None or not setup.daemon:  # one tray, channel only: no daemon, no domain to be ready
        return Run(command, "ok", duration_s=duration_s)
    peers = setup.trays - 1
    connected = peers - len(setup.blamed) if level == "domain" else None
    domain = Domain(0, "up" if setup.ready else "not_ready", peers, connected)
    ready_s = duration_s if setup.ready else None
    return Run(command, "ok", duration_s=duration_s, ready_s=ready_s, domain=domain, block=setup.block)


def _action_labels(action: Action) -> tuple[str, ...]:
    """The action labels of one teardown action: a stop that needed SIGKILL counts as ``kill_daemon`` too."""
    label = _LABELS.get(action.kind, "other")
    return (label, "kill_daemon") if action.kind == "stop_daemon" and action.killed else (label,)


def textfile(settings: Settings) -> Path | None:
    """``<textfile_dir>/imexctl.prom`` under ``[paths] root``, or None when metrics are off."""
    directory = settings.metrics.textfile_dir
    return settings.paths.root / directory.lstrip("/") / FILE_NAME if directory else None


def check_textfile_dir(directory: Path) -> None:
    """Refuse a ``textfile_dir`` that others than root may write (``log.dir_problem``, the log's rule).

    Raises:
        OSError: ``EPERM`` naming the directory, its owner and mode (or why it cannot be looked at).
    """
    import errno

    from imexctl.platform.log import dir_problem

    problem = dir_problem(directory)
    if problem:
        raise OSError(errno.EPERM, f"[metrics] textfile_dir: {problem}", str(directory))


def record(settings: Settings, run: Run, now: float, node: str = "") -> bool:
    """Add ``run`` to the totals and rewrite the text file; False when metrics are off.

    The block: the one ``run`` learned (a prolog that set up a domain), else
    the one the totals keep, else this ``node``'s in the topology source
    (:func:`tray_block`), so that the first failures after a boot carry it.
    The totals also keep the textfile directory, for :func:`fallback`.

    Raises:
        OSError: the state or the text file could not be written (the caller logs it; a hook never fails for it).
    """
    target = textfile(settings)
    if target is None:
        return False
    check_textfile_dir(target.parent)
    run_dir = settings.paths.run_dir
    with _locked(run_dir / "metrics.lock"):
        totals = _load(run_dir / STATE_FILE)
        _count(totals, run, now)
        totals["domain"] = _domain_after(settings, run, totals.get("domain"))._asdict()
        block = run.block or totals.get("block") or (tray_block(settings, node) if node else "")
        if block:
            totals["block"] = block
        totals["textfile_dir"] = settings.metrics.textfile_dir
        atomic_write(run_dir / STATE_FILE, json.dumps(totals, sort_keys=True) + "\n", mode=0o644)
        atomic_write(target, render(totals), mode=0o644)
    return True


def tray_block(settings: Settings, node: str) -> str:
    """``node``'s block in the topology source the prolog reads (``members.block_label``); '' without one.

    No NVML: a tray without a topology file learns its block from the prolog
    that sets up a domain, or from the live gauges' refresh (:func:`remember`).
    A source that does not load names no block (the prolog reports it).
    """
    if settings.topology.source == "none" or settings.paths.topology_file is None:
        return ""
    from imexctl.hooks import members
    from imexctl.platform.errors import ImexctlError

    try:
        return members.block_label(node, members.load_source(settings), None)
    except ImexctlError:
        return ""


def remembered(settings: Settings) -> tuple[str, str]:
    """``(textfile_dir, block)`` that the totals of ``settings``' run directory keep ('' for what they do not).

    They decide where root writes: totals that are not root's own, or that
    others may write, keep nothing.
    """
    totals = _load(settings.paths.run_dir / STATE_FILE, trusted=True)
    directory, block = totals.get("textfile_dir"), totals.get("block")
    return (directory if isinstance(directory, str) else ""), (block if isinstance(block, str) else "")


def remember(settings: Settings, block: str) -> bool:
    """Keep ``settings``' textfile directory and ``block`` in the totals, for :func:`fallback` and the hooks.

    The live gauges' refresh calls it: a tray that ran no hook since its boot
    then knows both.  Written only when they change; False when nothing was.

    Raises:
        OSError: the totals could not be written (the caller says so; the refresh goes on).
    """
    directory = settings.metrics.textfile_dir
    kept_dir, kept_block = remembered(settings)
    if not directory or (kept_dir == directory and block in ("", kept_block)):
        return False
    run_dir = settings.paths.run_dir
    with _locked(run_dir / "metrics.lock"):
        totals = _load(run_dir / STATE_FILE)
        totals["textfile_dir"] = directory
        if block:
            totals["block"] = block
        atomic_write(run_dir / STATE_FILE, json.dumps(totals, sort_keys=True) + "\n", mode=0o644)
    return True


def fallback(node: str) -> Settings | None:
    """The settings a run whose config file does not load writes its metrics with (docs/metrics.md).

    The built-in defaults under :data:`FALLBACK_ROOT` (``run_dir``
    ``/run/imexctl``), with the ``textfile_dir`` that the totals there
    remember from the last run that read a config, else
    :data:`FALLBACK_TEXTFILE_DIR` where that exists.  None when neither is:
    a tray that never had metrics counts nothing.  Nothing of the file that
    failed is used.
    """
    from imexctl.config import schema
    from imexctl.config.settings import from_values

    values, imex = schema.validate(None, {"paths": {"root": FALLBACK_ROOT}})
    settings = from_values(values, imex, node=node, source=None)
    directory = remembered(settings)[0]
    if not directory and (settings.paths.root / FALLBACK_TEXTFILE_DIR.lstrip("/")).is_dir():
        directory = FALLBACK_TEXTFILE_DIR
    return settings.replace(metrics__textfile_dir=directory) if directory else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """A short lock of its own: concurrent hooks of different jobs update the same totals."""
    import time

    from imexctl.platform.fsutil import ensure_dir, flock_held

    ensure_dir(path.parent, 0o755)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    stuck = OSError(f"{path} stayed locked for {_LOCK_WAIT_S:g}s")
    with flock_held(fd, _LOCK_WAIT_S, clock=time.monotonic, sleep=time.sleep, pause_s=0.01, stuck=stuck):
        yield


def _load(path: Path, *, trusted: bool = False) -> dict[str, Any]:
    """The totals so far; a missing or unreadable file starts them again (counters may reset).

    ``trusted``: a file that is not root's own, or that others may write, is none (``read_text_nofollow``).
    """
    try:
        data = json.loads(read_text_nofollow(path, trusted=trusted))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _count(totals: dict[str, Any], run: Run, now: float) -> None:
    def bump(section: str, key: str, by: float = 1) -> None:
        table = totals.setdefault(section, {})
        table[key] = table.get(key, 0) + by

    if run.command == "cleanup":
        bump("cleanup_runs", run.outcome)
        for action in run.actions:
            bump("cleanup_actions", action)
    else:
        bump("hook_runs", f"{run.command}\t{run.outcome}\t{run.error_code}")
        _observe(totals.setdefault("durations", {}), run.command, run.duration_s)
        if run.ready_s is not None:
            _observe(totals.setdefault("ready", {}), "prolog", run.ready_s)
        totals["daemon_lost"] = totals.get("daemon_lost", 0) + run.lost
        totals["daemon_busy_stops"] = totals.get("daemon_busy_stops", 0) + run.busy
        totals["sharing_unknown"] = totals.get("sharing_unknown", 0) + run.sharing_unknown
    totals.setdefault("last_run", {})[run.command] = now


def _observe(histograms: dict[str, Any], key: str, value: float) -> None:
    h = histograms.setdefault(key, {"buckets": [0] * len(BUCKETS), "sum": 0.0, "count": 0})
    for i, bound in enumerate(BUCKETS):
        if value <= bound:
            h["buckets"][i] += 1
    h["sum"] += value
    h["count"] += 1


def _domain_after(settings: Settings, run: Run, before: Mapping[str, Any] | None) -> Domain:
    """The domain after ``run``: what it learned, else the last known one while the same job owns the tray."""
    from imexctl.hooks.state import job_ids, read_state

    owners = job_ids(settings.paths.jobs_dir)
    owner = owners[0] if len(owners) == 1 else 0
    if run.domain is not None and owner:  # the prolog that just made the domain of this tray's one job
        return run.domain._replace(owner_job=owner)
    if owner == 0:
        return Domain()
    if before and before.get("owner_job") == owner:
        return Domain(**before)
    state = read_state(settings.paths.job(owner))
    return Domain(owner, "unknown", max(len(state.nodes) - 1, 0) if state else 0)


# ---------------------------------------------------------------- the text format


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _head(name: str) -> list[str]:
    kind, text = METRICS[name]
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


def render(totals: Mapping[str, Any]) -> str:
    """The whole text file: every metric of :data:`METRICS`, each with its HELP and TYPE lines."""
    lines = _head("imexctl_hook_runs_total")
    for key, n in sorted(totals.get("hook_runs", {}).items()):
        hook, outcome, code = key.split("\t")
        lines.append(f"imexctl_hook_runs_total{_labels(hook=hook, outcome=outcome, error_code=code)} {_number(n)}")
    lines += _head("imexctl_cleanup_runs_total")
    lines += [
        f"imexctl_cleanup_runs_total{_labels(outcome=k)} {_number(n)}"
        for k, n in sorted(totals.get("cleanup_runs", {}).items())
    ]
    lines += _head("imexctl_cleanup_actions_total")
    lines += [
        f"imexctl_cleanup_actions_total{_labels(action=k)} {_number(n)}"
        for k, n in sorted(totals.get("cleanup_actions", {}).items())
    ]
    lines += [*_head("imexctl_daemon_lost_total"), f"imexctl_daemon_lost_total {_number(totals.get('daemon_lost', 0))}"]
    busy = _number(totals.get("daemon_busy_stops", 0))
    lines += [*_head("imexctl_daemon_busy_stops_total"), f"imexctl_daemon_busy_stops_total {busy}"]
    unknown = totals.get("sharing_unknown", 0)
    lines += [*_head("imexctl_sharing_unknown_total"), f"imexctl_sharing_unknown_total {_number(unknown)}"]
    lines += _histogram("imexctl_hook_duration_seconds", "hook", totals.get("durations", {}))
    lines += _histogram("imexctl_time_to_ready_seconds", "hook", totals.get("ready", {}))
    domain = Domain(**totals["domain"]) if totals.get("domain") else Domain()
    lines += _gauge_lines(domain)
    lines += _head("imexctl_last_run_timestamp_seconds")
    lines += [
        f"imexctl_last_run_timestamp_seconds{_labels(command=k)} {_number(round(t, 3))}"
        for k, t in sorted(totals.get("last_run", {}).items())
    ]
    return "\n".join(with_block(lines, str(totals.get("block") or ""))) + "\n"


def with_block(lines: list[str], block: str) -> list[str]:
    """The lines with ``block="<block>"`` first among every sample's labels; as they are without a block.

    Every series of a tray carries its block (NVLink domain), so that the
    alerts of one domain's trays group into one (docs/metrics.md).
    """
    if not block:
        return lines
    label = f'block="{_escape(block)}"'
    out = []
    for line in lines:
        if line.startswith("#"):
            out.append(line)
            continue
        name, brace, rest = line.partition("{")
        if brace and " " not in name:
            out.append(f"{name}{{{label},{rest}")
        else:
            name, _, value = line.partition(" ")
            out.append(f"{name}{{{label}}} {value}")
    return out


def _histogram(name: str, label: str, histograms: Mapping[str, Any]) -> list[str]:
    lines = _head(name)
    for key, h in sorted(histograms.items()):
        for bound, n in zip(BUCKETS, h["buckets"]):
            lines.append(f"{name}_bucket{_labels(**{label: key, 'le': repr(float(bound))})} {_number(n)}")
        lines.append(f"{name}_bucket{_labels(**{label: key, 'le': '+Inf'})} {_number(h['count'])}")
        lines.append(f"{name}_sum{_labels(**{label: key})} {_number(round(h['sum'], 6))}")
        lines.append(f"{name}_count{_labels(**{label: key})} {_number(h['count'])}")
    return lines


def _gauge_lines(domain: Domain) -> list[str]:
    """The hooks' domain gauges (``imexctl status --prometheus`` prints the live ones: :mod:`imexctl.commands.live`)."""
    state = domain.state if domain.state in STATES else "unknown"
    lines = _head("imexctl_domain_state")
    lines += [f"imexctl_domain_state{_labels(state=s)} {int(s == state)}" for s in STATES]
    lines += [*_head("imexctl_domain_peers"), f"imexctl_domain_peers {domain.peers}"]
    lines += _head("imexctl_domain_peers_connected")
    if domain.connected is not None:
        lines.append(f"imexctl_domain_peers_connected {domain.connected}")
    lines += [*_head("imexctl_domain_owner_job"), f"imexctl_domain_owner_job {domain.owner_job}"]
    lines += [*_head("imexctl_build_info"), f"imexctl_build_info{_labels(version=build_version())} 1"]
    return lines


def build_version() -> str:
    """The ``version`` label of the build info: what ``imexctl --version`` names.

    The package's whole version (``0.1.0-2``: a rebuild of the same upstream
    version differs) where this process runs from the packages' versions
    (``platform.versions``), else imexctl's own.
    """
    from imexctl.platform import versions

    running = versions.read().running
    return running.version if running is not None else __version__
