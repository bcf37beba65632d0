"""Logging set-up (called once per command, from ``runtime.build``) and the event catalogue.

Event names are an interface: docs/events.md lists each one and a test keeps
the two in sync.  An admin's command logs through structlog, configured here
to write :mod:`imexctl.platform.log`'s lines on its sink; a hook gets a
:class:`~imexctl.platform.log.LineLogger` (the same lines without importing
structlog).  The one ``imexctl.failed`` line of a command that stops on an
error and the ``imexctl.crashed`` trace of a bug are written here too.
"""

from __future__ import annotations

import os

from imexctl.platform import log
from imexctl.platform.log import LEVELS, LineLogger, SinkLogger, open_sink

# typing and pathlib are not imported at run time; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping
    from pathlib import Path
    from typing import Any

    from imexctl.platform.errors import ImexctlError

__all__ = [
    "EVENTS",
    "configure_logging",
    "configure_structlog",
    "ensure_logging",
    "log_crash",
    "log_failure",
    "open_command_sink",
    "render_event",
    "reset_logging",
    "setup_command_logging",
    "setup_hook_logging",
]


# name -> one-line meaning (docs/events.md is checked against this table)
EVENTS: dict[str, str] = {
    "prolog.done": "summary of one prolog run: ok, reason, timings, port, channel",
    "epilog.done": "summary of one epilog run: ok, what was removed",
    "cleanup.done": "summary of one cleanup run",
    "imex.skipped": "the job gets no IMEX domain on this node (policy, fabric, shared node)",
    "imex.sharing_unknown": "Slurm 22.05: slurmctld did not say whether the job may share its trays; no domain",
    "imex.note_failed": "the note telling the job's user why it runs without IMEX could not be written",
    "prolog.deadline": "the readiness deadline was capped below slurm.conf's hook timeout (or it was unreadable)",
    "prolog.job_ended": "the job was cancelled while its prolog waited: rolled back, exit 0, no drain",
    "imex.channels.slurm": "slurm.conf sets SwitchType=switch/nvidia_imex: Slurm owns the channels, imexctl makes none",
    "imex.channel.waited": "the prolog waited until a domain torn down here, of its channel number, ended elsewhere",
    "imex.channel.memory_failed": "the record of the domains torn down on this tray could not be read or written",
    "imex.het_job": "a het job: one domain over its components (joint) or one per component",
    "imex.domain.split": "the job spans several NVLink domains: the one this tray joined and its tray count",
    "imex.nodes.resolved": "the job's trays in this NVLink domain, their addresses and the list's hash",
    "imex.config.written": "config.cfg and nodes_config.cfg written for the job",
    "imex.domain.kept": "the job's prolog ran again (slurmd restarted during it): its finished domain is kept",
    "imex.daemon.started": "the IMEX daemon was started for the job",
    "imex.daemon.stopped": "the job's IMEX daemon stopped",
    "imex.daemon.killed": "the job's IMEX daemon ignored SIGTERM and was killed",
    "imex.daemon.lost": "the epilog found that the job's IMEX daemon had ended before the job",
    "imex.daemon.stop_busy": "the epilog stopped the daemon while the job user's processes still held the driver",
    "imex.health.poll": "one readiness probe (debug)",
    "imex.ready": "the local daemon is READY and (level domain) the domain is UP",
    "imex.not_ready": "readiness deadline passed; carries the last connection table",
    "imex.peer_blamed": "the domain is not UP because a peer daemon reports itself not ready",
    "gpu.fabric.waiting": "a GPU's NVLink fabric registration is still pending; NVML is asked again every second",
    "gpu.fabric.degraded": "GPUs of the clique report fabric health problems that the prolog lets pass",
    "gpu.fabric.read": "the tray's fabric facts per GPU, its clique key and the time waited (debug)",
    "device.channel.created": "the job's IMEX channel device node was created",
    "device.channel.removed": "the job's IMEX channel device node was removed",
    "device.channel.foreign": "other channel nodes are visible next to the job's channel",
    "state.removed": "the job's per-job directory and state were removed",
    "prolog.rolled_back": "a failed prolog undid what it had done",
    "slurm.drained": "a failing hook drained its node with its own reason (sinfo -R), before slurmd reports it",
    "slurm.drain_failed": "a failing hook could not set its node's drain reason; Slurm's own stands",
    "metrics.failed": "the Prometheus text file could not be updated; the run itself is not affected",
    "health.done": "imexctl health found a fault of the tray, or drained or resumed the node in Slurm",
    "health.acknowledged": "an admin let go of the kernel evidence imexctl health kept pending (--acknowledge)",
    # logged by the packages' switch (pkg/imexctl-switch), a shell script, to syslog
    "package.switched": "the packages' switch put the installed version into use",
    "package.switch_refused": "the packages' switch kept the version in use: the installed one judged this tray unfit",
    "imexctl.failed": "a command failed with an expected error (error_code, exit_code)",
    "imexctl.crashed": "a command failed with an unexpected exception (a bug)",
}


def configure_logging(
    *, level: str = "info", log_file: Path | None = None, stderr_level: str = "warning", syslog: bool = False
) -> str | None:
    """Configure structlog once: JSON lines to ``log_file``, ``stderr`` and optionally syslog.

    Returns:
        A warning text if the log file could not be opened (logging then goes to stderr only).
    """
    sink, problem = open_sink(log_file=log_file, stderr_level=stderr_level, syslog=syslog)
    configure_structlog(sink, level)
    return problem


def configure_structlog(sink: SinkLogger, level: str) -> None:
    """Render every structlog line to ``sink``: JSON, with the bound context, the level and a UTC timestamp."""
    import structlog

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            render_event,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=lambda *_: sink,
        cache_logger_on_first_use=False,
    )


def render_event(_logger: object, _method: str, event_dict: MutableMapping[str, Any]) -> str:
    """The last structlog processor: the line :func:`render_json` makes, as for :class:`LineLogger`'s lines."""
    return log.render_json(event_dict)


def open_command_sink(log_file: Path | None, *, syslog: bool, verbose: bool) -> tuple[SinkLogger, str | None]:
    """A command's log sink (``[paths] log_file`` only as root) and the problem opening the file, if any."""
    log_file = log_file if os.geteuid() == 0 else None
    return open_sink(log_file=log_file, stderr_level="info" if verbose else "warning", syslog=syslog)


def setup_command_logging(level: str, context: Mapping[str, object], opened: tuple[SinkLogger, str | None]) -> None:
    """Configure structlog once on the opened sink, and bind ``context`` (hook, job id, node) to every line."""
    import structlog

    sink, problem = opened
    configure_structlog(sink, level)
    _sinks["command"] = sink
    structlog.contextvars.bind_contextvars(**context)
    if problem:
        structlog.get_logger().warning("imexctl.failed", error_code="log_file", reason=problem)


# "hook": a hook's logger, once setup_hook_logging has made it; the failure and crash lines go where its lines go
_current: dict[str, LineLogger] = {}


# "command": the sink of an admin's command, once setup_command_logging has configured structlog on it
_sinks: dict[str, SinkLogger] = {}


def setup_hook_logging(level: str, context: Mapping[str, object], opened: tuple[SinkLogger, str | None]) -> LineLogger:
    """A hook's logger on the opened sink, ``context`` on every line: structlog's lines, without importing structlog."""
    sink, problem = opened
    logger = _current["hook"] = LineLogger(sink, level, dict(context))
    if problem:
        logger.warning("imexctl.failed", error_code="log_file", reason=problem)
    return logger


def reset_logging() -> None:
    """Forget an earlier hook's logger (``cli.main`` runs one command; tests run many in one process)."""
    _current.clear()
    _sinks.clear()


def log_failure(exc: ImexctlError, *, stderr: bool = True) -> None:
    """The one ``imexctl.failed`` line of a command that stops on an error.

    ``stderr=False`` (an admin's command, which says it on stderr in plain
    words): the line goes to the log file and syslog only, where a command
    opened them; without its sink it goes nowhere.
    """
    hook = _current.get("hook")
    if hook is not None:
        hook.error("imexctl.failed", error_code=exc.code, exit_code=int(exc.exit_code), reason=str(exc))
        return
    sink = _sinks.get("command")
    if not stderr and sink is None:
        return
    import structlog

    ensure_logging()
    quiet = sink.quiet if sink is not None else False
    if sink is not None:
        sink.quiet = not stderr
    try:
        structlog.get_logger().error(
            "imexctl.failed", error_code=exc.code, exit_code=int(exc.exit_code), reason=str(exc)
        )
    finally:
        if sink is not None:
            sink.quiet = quiet


def log_crash() -> None:
    """A bug: a structured trace (``imexctl.crashed``), never a bare traceback in slurmd's log only."""
    import structlog

    hook = _current.get("hook")
    if hook is not None:  # a hook: structlog renders the trace, on the hook's sink and with its context
        configure_structlog(hook.sink, hook.level)
        structlog.contextvars.bind_contextvars(**hook.context)
    ensure_logging()
    structlog.get_logger().exception("imexctl.crashed")


def ensure_logging() -> None:
    """Configure structlog with the defaults unless a command already did."""
    import structlog

    if not structlog.is_configured():
        configure_logging()
