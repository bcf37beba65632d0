"""The hooks' fast path: a prolog that policy skips, an epilog with nothing to do, ``--version``.

Most hook runs on a shared cluster have nothing to do: the policy skips the
job, or the job never had a domain on this tray.  Every job start waits for
the prolog on every tray, every job end for the epilog, so these runs must
cost little more than the interpreter's own start (docs/performance.md).
:func:`run` decides them importing only ``os``, ``sys``, ``time``,
``datetime`` and imexctl's light modules (``config.schema``, ``slurm.job``,
``slurm.nodelist``, ``hooks.gate``, ``hooks.summary``, ``platform.log``,
``platform.slurmenv``, ``channels.notes``, ``channels.job``, ``platform.procscan``),
none of which imports
``dataclasses``, ``pathlib``, ``argparse``, ``json``, ``typing`` or ``enum``,
let alone structlog or psutil.

It is a way of calling the same code early, not a second copy of it: the
decisions are :mod:`imexctl.hooks.gate`'s, which the full commands call too.
It answers only when it is sure, with the same checks, lines and exit code as
the full command; in every other case it returns None and ``cli`` runs the
full command, which reports what is wrong:

- the command line is exactly ``[--config FILE] [-v] prolog|epilog`` (or
  ``--version``), and it runs as root;
- the config file is safe to read, parses (``schema.parse_ini_subset``, the
  one reader of every path) and is valid (``schema.validate``), and
  ``[metrics] textfile_dir`` is not set (recording metrics needs the settings);
- slurmd's environment is valid (``slurm.JobContext.from_env``);
- the log file opens without creating its directory;
- prolog: ``gate.skipped_prolog`` skips the job (and its note, if any, was left);
- epilog: ``gate.nothing_left``: the job's note for its TaskProlog
  (``notes``) is removed, and neither the job (nor its het job) left a
  directory, a process naming its config, or its channel node here
  (``gate.left_anything``, looked at conservatively: any process naming the
  config, any channel node of the job's minor, is left to the full epilog to judge).

What it read before it declined, the config file's validated sections and the
job, goes to the full command (:func:`start`, :class:`Read`), which then reads
neither again.
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

    from imexctl.config.sections import NodePaths, Policy
    from imexctl.hooks.summary import Line
    from imexctl.platform.log import SinkLogger
    from imexctl.slurm.job import JobContext

__all__ = ["Read", "hook_args", "run", "start"]


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


class Read:
    """What the fast path read for a hook it did not finish, handed to the full command so it reads nothing twice.

    ``config`` is the file :func:`imexctl.config.schema.find_config` chose and
    ``found`` whether it was there; ``values`` and ``imex`` are
    :func:`imexctl.config.schema.validate`'s answer; ``job`` is the job from
    slurmd's environment (None when that is invalid: the full command reads it
    again and names the problem).  A frozen record, without ``dataclasses``.
    """

    __slots__ = ("config", "found", "imex", "job", "values")

    config: str
    found: bool
    values: dict[str, dict[str, Any]]
    imex: dict[str, str]
    job: JobContext | None

    def __init__(
        self, config: str, found: bool, values: dict[str, dict[str, Any]], imex: dict[str, str], job: JobContext | None
    ) -> None:
        for name, value in (("config", config), ("found", found), ("values", values), ("imex", imex), ("job", job)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Read is frozen: cannot set {name}")


def run(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Run a hook that has nothing to do, or ``--version``: the exit code; None when the full command must run."""
    return start(argv, env)[0]


def start(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, Read | None]:
    """:func:`run`, and for a hook it leaves to the full command what it read (None: nothing, or not sure of it)."""
    if list(argv) == ["--version"]:
        sys.stdout.write(f"imexctl {__version__}\n")
        return 0, None
    parsed = hook_args(argv)
    if parsed is None or os.geteuid() != 0:
        return None, None
    command, explicit, verbose = parsed
    t0 = time.monotonic()
    read = _read(command, explicit, env)
    if read is None:
        return None, None
    return _answer(command, verbose, read, t0), read


def _read(command: str, explicit: str | None, env: Mapping[str, str]) -> Read | None:
    """The validated sections of the config file, and the job; None when the file is unsafe or invalid.

    The full command then reads it again, with the same reader, and names what is wrong.
    """
    try:
        path, required = schema.find_config(explicit, env)
        text = schema.read_config(path, required=required, euid=0)
        raw = {} if text is None else schema.parse_ini_subset(text, path)
        values, imex = schema.validate(path, raw)
    except schema.SchemaError:
        return None
    from imexctl.slurm.job import JobContext

    try:
        job: JobContext | None = JobContext.from_env(env, need_nodes=command == "prolog")
    except Exception:  # any problem with the environment: the full command names it
        job = None
    return Read(path, text is not None, values, imex, job)


def _answer(command: str, verbose: bool, read: Read, t0: float) -> int | None:
    """Finish a hook with nothing to do (0); None when the full command must run (it reports what is wrong)."""
    job, values = read.job, read.values
    if job is None or values["metrics"]["textfile_dir"]:  # recording metrics needs the settings
        return None
    paths = schema.node_paths(values["paths"], job.node)
    if command == "prolog":
        from imexctl.config.sections import Policy

        lines = _skipped_prolog(job, Policy(**values["policy"]), paths, t0)
    else:
        lines = _idle_epilog(job, paths, t0)
    if lines is None:
        return None
    sink = _sink(paths.log_file, verbose, values["log"]["syslog"] == "yes")
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


def _skipped_prolog(job: JobContext, policy: Policy, paths: NodePaths, t0: float) -> list[Line] | None:
    """The lines of a prolog that policy skips (``gate.skipped_prolog``); None when it is not, or the note failed."""
    from imexctl.hooks import gate, summary

    skip = gate.skipped_prolog(job, policy, paths)
    if skip is None or skip.problem:  # the full prolog logs why the note failed
        return None
    return summary.skipped_lines(skip.reason, skip.told, round(time.monotonic() - t0, 3))


def _idle_epilog(job: JobContext, paths: NodePaths, t0: float) -> list[Line] | None:
    """The line of an epilog whose job left nothing here (``gate.nothing_left``); None when it may have."""
    from imexctl.hooks import gate, summary
    from imexctl.platform.procscan import mentioned_in_proc

    def left(job_id: int) -> bool:
        job_dir = schema.job_dir(paths.run_dir, job_id)
        return gate.left_anything(
            job_dir,
            os.path.join(job_dir, schema.JOB_CONFIG),
            has_process=lambda config: mentioned_in_proc(config, uids={0, os.geteuid()}),  # a daemon's owners
        )

    if not gate.nothing_left(job, paths, left):
        return None
    return [("epilog.done", summary.epilog_fields([], round(time.monotonic() - t0, 3)))]


def _sink(log_file: str, verbose: bool, syslog: bool) -> SinkLogger | None:
    """The run's sink; None when the log file does not open as it is (the full command makes or reports it)."""
    from imexctl.platform.log import open_sink

    sink, problem = open_sink(
        log_file=log_file, stderr_level="info" if verbose else "warning", syslog=syslog, make_dir=False
    )
    return None if problem else sink
