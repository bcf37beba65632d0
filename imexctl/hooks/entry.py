"""The hooks' front door: ``prolog``, ``epilog`` (and ``cleanup``), argv and environment in, exit code out.

Every job start waits for the prolog on every tray, every job end for the
epilog, and most of these runs have nothing to do (docs/performance.md).  So a
hook goes through three tiers, each run only when the one before could not
finish it, each deciding with the same gates (:mod:`imexctl.hooks.gate`):

1. the fast tier (:func:`first`, :mod:`imexctl.hooks.quick`): before the
   command line is parsed, with light modules only: a prolog that policy
   skips, an epilog whose job left nothing here;
2. the settings tier (:func:`run`): the hook's runtime (``runtime.build``),
   then the same decisions with the settings and the given host
   (``gate.idle_prolog``, ``teardown.idle_epilog``): a site with metrics, a
   log directory still to make, a test's fake host;
3. the full hook: :func:`imexctl.hooks.prolog.prolog` or
   :func:`imexctl.hooks.teardown.epilog` (``cleanup`` comes here directly);

and then the metrics of whatever ran (``metrics.count``).  :mod:`imexctl.cli`
keeps the parsing, the dispatch and the one place that maps errors to exit
codes.  At module level this module imports only :mod:`imexctl.hooks.quick`
(light: the fast tier's own imports).
"""

from __future__ import annotations

import sys

from imexctl.hooks import quick

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Any, Callable

    from imexctl.gpu.fabric import Gpu
    from imexctl.hooks.quick import Read
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.host import Host
    from imexctl.slurm.job import JobContext

__all__ = ["COMMANDS", "first", "hook_line", "run"]

#: the commands that come in here: the two hooks, and cleanup (the same runtime, faults and metrics)
COMMANDS = ("prolog", "epilog", "cleanup")


def hook_line(argv: Sequence[str]) -> tuple[str, str | None, bool] | None:
    """``(command, config, verbose)`` of a plain hook command line (``[--config FILE] [-v] prolog|epilog``), else None.

    What slurmd runs: the console script then runs without the cyclic garbage
    collector and ends with ``os._exit``, and ``cli`` parses the line without
    argparse (``quick.hook_args``, tests/cli/test_cli.py holds the two equal).
    """
    return quick.hook_args(argv)


def first(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, Read | None]:
    """The fast tier: the exit code of a hook it finished (or ``--version``), and what it read for the next tiers.

    ``(None, read)`` when the settings tier must decide; ``read`` (the config
    file's validated sections and the job) is None when it read nothing it
    is sure of.  A bug in it never fails a hook: the next tiers decide alone.
    """
    try:
        return quick.start(argv, env)
    except Exception:  # tests call quick.run to see such a bug
        return None, None


def run(
    args: argparse.Namespace,
    env: Mapping[str, str],
    host: Host | None = None,
    gpu: Gpu | None = None,
    on_step: Callable[[str], None] | None = None,
    read: Read | None = None,
) -> int:
    """The settings tier, then the full hook (or ``cleanup``), then the metrics: 0, or raise the hook's failure.

    ``read`` is what the fast tier read before it declined: the settings are
    built from its validated sections and the job is its job, neither read
    again.  ``host`` and ``gpu`` are the tests' fakes, ``on_step`` their fault
    injection at each step boundary.

    Raises:
        ImexctlError: the hook failed (it logged its summary line); ``cli`` maps it to the exit code.
    """
    from imexctl.hooks.runtime import Needs, build, with_gpu
    from imexctl.platform.errors import NotPrivilegedError

    hook = args.command in ("prolog", "epilog")
    # the early paths never ask NVML: with no GPU given, none is made
    needs = Needs(logs="hook", gpu="none", hook_lookup=True) if hook else Needs(logs="command", gpu="none")
    rt = build(args.command, env, needs, config=args.config, verbose=args.verbose, host=host, gpu=gpu, read=read).rt
    job = _job(args.command, env, read) if hook else None
    if job is not None and rt.host.euid() == 0 and _settings_tier(args.command, job, rt):
        return 0
    if rt.host.euid() != 0:
        raise NotPrivilegedError(f"imexctl {args.command} must run as root")
    rt = with_gpu(rt)
    if on_step:
        rt = rt._replace(on_step=on_step)
    return _full(args, env, rt, job)


def _job(command: str, env: Mapping[str, str], read: Read | None) -> JobContext | None:
    """The hook's job, read once for the whole run: the fast tier's, else from ``env``.

    None when the environment is invalid: the full hook reads it again and
    reports the problem, as it always does.
    """
    if read is not None:
        return read.job
    from imexctl.platform.errors import ImexctlError
    from imexctl.slurm.job import JobContext

    try:
        return JobContext.from_env(env, need_nodes=command == "prolog")
    except ImexctlError:
        return None


def _settings_tier(command: str, job: JobContext, rt: Runtime) -> bool:
    """Finish a prolog that policy skips, or an epilog with nothing to do, before the full hook is imported.

    ``rt`` carries a ``log.LineLogger`` and, when none was given, no GPU:
    these paths never ask NVML.  False (nothing logged) when the full hook
    must run (docs/performance.md).
    """
    t0 = rt.host.monotonic()
    result: Any
    if command == "prolog":
        from imexctl.hooks.gate import idle_prolog

        result = idle_prolog(job, rt)
    else:
        from imexctl.hooks.teardown import idle_epilog

        result = idle_epilog(job, rt)
    if result is None:
        return False
    _count(rt, command, result, None, rt.host.monotonic() - t0)
    return True


def _full(args: argparse.Namespace, env: Mapping[str, str], rt: Runtime, job: JobContext | None) -> int:
    """Run the prolog, the epilog or cleanup, then count it in the metrics (the one place that does)."""
    t0 = rt.host.monotonic()
    result: Any = None
    error: BaseException | None = None
    try:
        if args.command == "prolog":
            from imexctl.hooks.prolog import prolog

            result = prolog(env, rt, job)
        elif args.command == "epilog":
            from imexctl.hooks.teardown import epilog

            result = epilog(env, rt, job)
        else:
            result = _cleanup(args, rt)
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not getattr(args, "dry_run", False):
            _count(rt, args.command, result, error, rt.host.monotonic() - t0)
    return 0


def _cleanup(args: argparse.Namespace, rt: Runtime) -> Any:
    """``imexctl cleanup``: the teardown of what jobs left, printed as text or in the ``--json`` envelope."""
    from imexctl.hooks.teardown import cleanup

    result = cleanup(rt, job_id=args.job, dry_run=args.dry_run, force=args.force)
    if args.json:
        from imexctl.platform.output import print_json

        print_json(result)
    else:
        sys.stdout.write(result.text())
    return result


def _count(rt: Runtime, command: str, result: Any, error: BaseException | None, duration_s: float) -> None:
    """Update the Prometheus text file ([metrics] textfile_dir); a failure is a warning, never the run's."""
    if not rt.settings.metrics.textfile_dir:
        return
    try:
        from imexctl.hooks import metrics

        counted = metrics.run_of(command, result, error, duration_s, rt.settings.readiness.level)
        metrics.record(rt.settings, counted, rt.host.time())
    except Exception as exc:  # metrics must never fail a hook
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")
