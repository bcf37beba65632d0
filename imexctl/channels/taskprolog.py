"""``imexctl task-prolog``: tell each task of a job its IMEX channel number (Slurm ``TaskProlog=``).

slurmd runs the TaskProlog as the job's user before every task and reads
its standard output line by line: ``export NAME=value`` sets a variable in
the task's environment, ``print text`` writes the text to the task's
standard output (slurm ``src/slurmd/slurmstepd/task.c`` ``_proc_stdout``).
We print exactly one line: ``export NVIDIA_IMEX_CHANNELS=<minor>`` when the
job has a domain with a channel on this tray that is the caller's
(:mod:`imexctl.channels.job`); else, in the step's first task
(``SLURM_PROCID`` 0), ``print imexctl: IMEX was not set up for job N: ...``
when the prolog left that note (:mod:`imexctl.channels.notes`: the job may share its
trays, and how to get IMEX), or ``print imexctl: cannot tell ...`` when what the
prolog left here cannot be read by the job's user (a run directory that a
strict umask made ``0750``: ``jobchannel.Unreadable``, a fault of the tray
that the job's output should show); nothing otherwise.

Two rules come from Slurm and are never broken here:

- **exit 0, always.**  A TaskProlog that exits non-zero cancels the task
  (Slurm 22.05 and later); a missing channel is the prolog's and
  ``imexctl status``'s business, not a reason to kill tasks.
- **nothing on standard error.**  slurmd reads standard error through the
  same pipe as standard output (``src/common/run_command.c``
  ``_run_command_child``), so a diagnostic starting with ``export `` would
  be obeyed.  With ``IMEXCTL_TASK_PROLOG_DEBUG=1`` in the task's
  environment the reason for printing nothing comes as one
  ``print imexctl: ...`` line, which Slurm writes to the task's output.

It runs once per task (4 per GB200 tray), so it imports nothing but
:mod:`imexctl.channels.job`; the hook script runs it as
``/opt/imexctl/bin/python -I -m imexctl.channels.taskprolog``.
"""

from __future__ import annotations

import os
import sys

from imexctl import slurm as var
from imexctl.channels import job as jobchannel

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import TextIO

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["DEBUG_VARIABLE", "VARIABLE", "command", "lines", "main", "run"]

#: the variable the task gets; the NVIDIA Container Toolkit reads the same name (docs/containers.md)
VARIABLE = "NVIDIA_IMEX_CHANNELS"
#: set to 1 in the job's environment to see why nothing was exported
DEBUG_VARIABLE = "IMEXCTL_TASK_PROLOG_DEBUG"


def lines(
    env: Mapping[str, str],
    *,
    config: str | None = None,
    uid: int | None = None,
    uid_map: jobchannel.UidMap = None,
    read_map: bool = True,
) -> list[str]:
    """The lines to print for the task with environment ``env``.

    Args:
        env: the task's environment (slurmd passes the job's).
        config: an explicit config file (``imexctl --config``); else the usual lookup.
        uid: the caller's uid (default: ``os.getuid()``).
        uid_map: the caller's uid map (default: ``/proc/self/uid_map`` when ``read_map``).
        read_map: whether to read ``/proc/self/uid_map`` when ``uid_map`` is None.
    """
    if uid_map is None and read_map:
        uid_map = jobchannel.read_uid_map()
    paths = None
    try:
        paths = jobchannel.read_paths(env, config, uid_map)
        caller = jobchannel.caller_host_uid(uid_map, uid)
        channel = jobchannel.find_job(paths, jobchannel.candidate_job_ids(env), caller, uid_map)
        fd, _ = jobchannel.open_channel(channel, uid_map)
        os.close(fd)
    except jobchannel.NoChannel as exc:
        note = _note(env, paths, uid_map)
        if note:
            return [f"print imexctl: {note}"]
        if isinstance(exc, jobchannel.Unreadable) and _first_task(env):
            return [f"print imexctl: cannot tell this job's IMEX channel on this node: {_one_line(str(exc))}"]
        return [f"print imexctl: no IMEX channel exported: {_one_line(str(exc))}"] if _debug(env) else []
    return [f"export {VARIABLE}={channel.minor}"]


def _note(env: Mapping[str, str], paths: jobchannel.NodePaths | None, uid_map: jobchannel.UidMap) -> str:
    """The prolog's note for this job (why it runs without IMEX), for the job's first task only; else ''."""
    if paths is None or not _first_task(env):
        return ""
    return _one_line(jobchannel.read_note(paths, jobchannel.candidate_job_ids(env), uid_map))


def _first_task(env: Mapping[str, str]) -> bool:
    """Whether this is the step's first task (``SLURM_PROCID`` 0, or none set)."""
    return var.value(env, var.PROCID).strip() in ("", "0")


def _debug(env: Mapping[str, str]) -> bool:
    try:
        return env.get(DEBUG_VARIABLE, "") not in ("", "0", "no")
    except Exception:  # an environment that cannot be read: no debug line
        return False


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:400]


def run(env: Mapping[str, str], *, config: str | None = None, out: TextIO | None = None) -> int:
    """Print :func:`lines` and return 0, whatever happens (a bug included: then nothing is printed)."""
    try:
        text = "".join(f"{line}\n" for line in lines(env, config=config))
    except Exception:  # a bug must not cancel the user's task; the reason is only for the debug line
        text = "print imexctl: task-prolog failed unexpectedly\n" if _debug(env) else ""
    try:
        stream = out if out is not None else sys.stdout
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # slurmd closed the pipe: nothing to tell anyone
        pass
    return 0


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl task-prolog``: the job user's command, with no settings machinery and no logging set-up."""
    return run(env, config=args.config)


def main() -> int:
    """Entry point of ``python -m imexctl.channels.taskprolog``."""
    return run(os.environ)


if __name__ == "__main__":
    sys.exit(main())
