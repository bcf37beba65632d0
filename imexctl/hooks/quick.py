"""The hooks' fast path: a prolog that policy skips, an epilog with nothing to do, ``--version``.

Most hook runs on a shared cluster have nothing to do: the policy skips the
job, or the job never had a domain on this tray.  Every job start waits for
the prolog on every tray, every job end for the epilog, so these runs must
cost little more than the interpreter's own start (docs/performance.md).
:func:`run` decides them importing only ``os``, ``sys``, ``time``,
``datetime`` and imexctl's light modules (``schema``, ``slurm``,
``nodelist``, ``gate``, ``log``, ``jobchannel``, ``procscan``), none of
which imports ``dataclasses``, ``pathlib``, ``argparse``, ``configparser``,
``json``, ``typing`` or ``enum``, let alone structlog or psutil.

It answers only when it is sure, with the same checks, lines and exit code as
the full command; in every other case it returns None and ``cli`` runs the
full command, which reports what is wrong:

- the command line is exactly ``[--config FILE] [-v] prolog|epilog`` (or
  ``--version``), and it runs as root;
- the config file is safe to read, plainly written (``schema.parse_ini_subset``)
  and valid (``schema.validate``, the full command's own validation), and
  ``[metrics] textfile_dir`` is not set (recording metrics needs the settings);
- slurmd's environment is valid (``slurm.JobContext.from_env``);
- the log file opens without creating its directory;
- prolog: ``gate.policy_skip`` skips the job;
- epilog: the job's note for its TaskProlog (``notes``) is removed, and
  neither the job (nor its het job) left a directory, a process
  naming its config, or its channel node here (the full epilog's
  ``teardown._left_anything``, answered conservatively: a channel node of the
  job's minor is left to the full epilog to judge).
"""

from __future__ import annotations

import os
import sys
import time

from imexctl import __version__
from imexctl.config import schema

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from imexctl.platform.log import SinkLogger
    from imexctl.slurm.job import JobContext

__all__ = ["hook_args", "run"]


def hook_args(argv: Sequence[str]) -> tuple[str, str | None, bool] | None:
    """``(command, config, verbose)`` of a plain hook command line, else None.

    Plain: top-level options before the command, as argparse takes them
    (``--config FILE``, ``--config=FILE``, ``-v``, ``--verbose``), then
    ``prolog`` or ``epilog`` and nothing after it.
    """
    config: str | None = None
    verbose = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("prolog", "epilog"):
            return (arg, config, verbose) if i == len(argv) - 1 else None
        if arg in ("-v", "--verbose"):
            verbose = True
        elif arg == "--config" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            config, i = argv[i + 1], i + 1
        elif arg.startswith("--config=") and len(arg) > len("--config="):
            config = arg[len("--config=") :]
        else:
            return None
        i += 1
    return None


def run(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Run a hook that has nothing to do, or ``--version``: the exit code; None when the full command must run."""
    if list(argv) == ["--version"]:
        sys.stdout.write(f"imexctl {__version__}\n")
        return 0
    parsed = hook_args(argv)
    if parsed is None or os.geteuid() != 0:
        return None
    command, explicit, verbose = parsed
    t0 = time.monotonic()
    values = _settings(explicit, env)
    if values is None:
        return None
    from imexctl.slurm.job import JobContext

    try:
        job = JobContext.from_env(env, need_nodes=command == "prolog")
    except Exception:  # any problem with the environment: the full command names it
        return None
    paths = schema.node_paths(values["paths"], job.node)
    if command == "prolog":
        lines = _skipped_prolog(job, values["policy"], paths, t0)
    else:
        lines = _idle_epilog(job, values["policy"], paths, t0)
    if lines is None:
        return None
    sink = _sink(paths["log_file"], verbose, values["log"]["syslog"] == "yes")
    if sink is None:
        return None
    from imexctl.platform.log import LineLogger

    log = LineLogger(sink, values["log"]["level"], {"hook": command, "job_id": job.job_id, "node": job.node})
    try:
        for event, fields in lines:
            log.info(event, **fields)
    except OSError:  # the log cannot be written: the full command reports it
        return None
    return 0


def _settings(explicit: str | None, env: Mapping[str, str]) -> dict[str, dict[str, Any]] | None:
    """The validated sections of a plainly written config file; None for anything the full command must see."""
    try:
        path, required = schema.find_config(explicit, env)
        text = schema.read_config(path, required=required, euid=0)
        raw = {} if text is None else schema.parse_ini_subset(text)
        if raw is None:
            return None
        values, _ = schema.validate(path, raw)
    except schema.SchemaError:
        return None
    return None if values["metrics"]["textfile_dir"] else values


def _skipped_prolog(
    job: JobContext, policy: Mapping[str, Any], paths: Mapping[str, str], t0: float
) -> list[tuple[str, dict[str, Any]]] | None:
    """The lines of a prolog that policy skips (``gate.prolog_done``'s); None when it is not skipped."""
    from imexctl.hooks.gate import policy_skip, tell_user, told_field

    skip = policy_skip(job, policy)
    if not skip:
        return None
    try:
        told = tell_user(job, skip, paths["run_dir"], paths["proc_devices"])
    except OSError:  # the full prolog reports it
        return None
    done = {"ok": True, "duration_s": round(time.monotonic() - t0, 3), "skipped": skip, **told_field(told)}
    return [("imex.skipped", {"reason": skip}), ("prolog.done", done)]


def _idle_epilog(
    job: JobContext, policy: Mapping[str, Any], paths: Mapping[str, str], t0: float
) -> list[tuple[str, dict[str, Any]]] | None:
    """The line of an epilog whose job left nothing here (``teardown._epilog_done``'s); None when it may have."""
    from imexctl.channels import notes
    from imexctl.channels.job import channel_minor
    from imexctl.platform.procscan import mentioned_in_proc

    notes.forget(paths["run_dir"], job.job_id)  # as the full epilog does, before anything else
    jobs_dir = os.path.join(paths["run_dir"], "jobs")
    for jid in dict.fromkeys([job.job_id, *([job.het_job_id] if job.het_job_id else [])]):
        job_dir = os.path.join(jobs_dir, str(jid))
        if os.path.lexists(job_dir) or mentioned_in_proc(os.path.join(job_dir, "config.cfg")):
            return None
        if policy["channels"] == "job":
            minor = channel_minor(jid, policy["channel_count"])
            if os.path.lexists(os.path.join(paths["channel_dir"], f"channel{minor}")):
                return None
    return [("epilog.done", {"ok": True, "actions": [], "duration_s": round(time.monotonic() - t0, 3)})]


def _sink(log_file: str, verbose: bool, syslog: bool) -> SinkLogger | None:
    """The run's sink; None when the log file does not open as it is (the full command makes or reports it)."""
    from imexctl.platform.log import SinkLogger, open_log_file

    file = None
    if log_file:
        try:
            file = open_log_file(log_file, make_dir=False)
        except OSError:
            return None
    return SinkLogger(file, sys.stderr, 20 if verbose else 30, syslog)
