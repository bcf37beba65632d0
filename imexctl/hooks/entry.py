"""The hooks' front door: ``prolog``, ``epilog`` (and ``cleanup``), argv and environment in, exit code out.

Every job start waits for the prolog on every tray, every job end for the
epilog, and most of these runs have nothing to do: the policy skips the job,
or the job never had a domain on this tray (docs/performance.md).  So a hook
goes through three tiers, read here top-down, each run only when the one
before could not finish it, each deciding with the same gates
(:mod:`imexctl.hooks.gate`):

1. the fast tier (:func:`first`): before the command line is parsed, with
   light modules only, it answers ``--version``, a prolog that policy skips
   (``gate.skipped_prolog``) and an epilog whose job left nothing here
   (``gate.nothing_left``);
2. the settings tier (:func:`run`): the hook's runtime (``runtime.build``),
   then the same decisions with the settings and the given host
   (``gate.skipped_prolog``, ``teardown.idle_epilog``): a site with metrics, a
   log directory still to make, a test's fake host;
3. the full hook: :func:`imexctl.hooks.prolog.prolog` or
   :func:`imexctl.hooks.teardown.epilog` (``cleanup`` comes here directly);

and then the metrics of whatever ran (``metrics.count``); a hook whose config
file does not load is counted too, in the fallback (``metrics.fallback``,
docs/metrics.md).  :mod:`imexctl.cli` keeps the parsing, the dispatch and the
one place that maps errors to exit codes.

The fast tier is a way of calling the same code early, not a second copy of
it.  It answers only when it is sure, with the same checks, lines and exit
code as the full hook; in every other case the next tiers decide, and the
full hook reports what is wrong:

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
job (:class:`Read`), goes to the next tiers, which then read neither again.

Each module a hook loads costs it about 0.1 ms before it runs a line
(docs/performance.md), so the fast tier lives here, in the module ``cli``
imports for every hook run, and loads only what its answer needs: at module
level this module imports only ``os``, ``sys``, ``time`` and
:mod:`imexctl`; ``--version`` loads only :mod:`imexctl.platform.versions` (the
package's version in use, and one installed beside it), a skipped prolog and an idle
epilog the light modules the gates and the log need (``config.schema``,
``slurm.job``, ``hooks.gate``, ``platform.log``, and for
the epilog ``channels.notes`` and ``platform.procscan``), none of which
imports ``collections``, ``dataclasses``, ``pathlib``, ``argparse``, ``json``,
``typing`` or ``enum``, let alone structlog or psutil
(tests/hooks/test_fast_tier.py holds the list).
"""

from __future__ import annotations

import os
import sys
import time

from imexctl import __version__

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Any, Callable

    from imexctl.config.schema import NodePaths, Policy
    from imexctl.gpu.fabric import Gpu
    from imexctl.hooks.gate import Line
    from imexctl.hooks.results import PrologResult
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.host import Host
    from imexctl.platform.log import SinkLogger
    from imexctl.slurm.job import JobContext

__all__ = ["COMMANDS", "Read", "fast", "first", "hook_line", "run"]

#: the commands that come in here: the two hooks, and cleanup (the same runtime, faults and metrics)
COMMANDS = ("prolog", "epilog", "cleanup")


def hook_line(argv: Sequence[str]) -> tuple[str, str | None, bool] | None:
    """``(command, config, verbose)`` of a plain hook command line, else None.

    What slurmd runs: the console script then runs without the cyclic garbage
    collector and ends with ``os._exit``, and ``cli`` parses the line without
    argparse (tests/cli/test_cli.py holds the two equal).

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


# ---- 1. the fast tier


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


def first(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, Read | None]:
    """The fast tier: the exit code of a hook it finished (or ``--version``), and what it read for the next tiers.

    ``(None, read)`` when the settings tier must decide; ``read`` (the config
    file's validated sections and the job) is None when it read nothing it
    is sure of.  A bug in it never fails a hook: the next tiers decide alone.
    """
    try:
        return fast(argv, env)
    except Exception:  # tests call fast() to see such a bug
        return None, None


def fast(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, Read | None]:
    """The fast tier, unguarded (the tests call it to see a bug): :func:`first`'s answer."""
    if list(argv) == ["--version"]:
        from imexctl.platform import versions

        sys.stdout.write(versions.version_line(versions.read(), __version__) + "\n")
        return 0, None
    parsed = hook_line(argv)
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
    from imexctl import slurm
    from imexctl.config import schema

    try:
        path, required = schema.find_config(explicit, env, slurm_conf=slurm.value(env, slurm.CONF))
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
    from imexctl.config import schema

    paths = schema.node_paths(values["paths"], job.node)
    if command == "prolog":
        lines = _skipped_prolog(job, schema.Policy(**values["policy"]), paths, t0)
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
    from imexctl.hooks import gate

    skip = gate.skipped_prolog(job, policy, paths)
    if skip is None or skip.problem:  # the full prolog logs why the note failed
        return None
    return gate.skipped_lines(skip.reason, skip.told, round(time.monotonic() - t0, 3))


def _idle_epilog(job: JobContext, paths: NodePaths, t0: float) -> list[Line] | None:
    """The line of an epilog whose job left nothing here (``gate.nothing_left``); None when it may have."""
    from imexctl.config import schema
    from imexctl.hooks import gate
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
    return [("epilog.done", gate.epilog_fields([], round(time.monotonic() - t0, 3)))]


def _sink(log_file: str, verbose: bool, syslog: bool) -> SinkLogger | None:
    """The run's sink; None when the log file does not open as it is (the full command makes or reports it)."""
    from imexctl.platform.log import open_sink

    sink, problem = open_sink(
        log_file=log_file, stderr_level="info" if verbose else "warning", syslog=syslog, make_dir=False
    )
    return None if problem else sink


# ---- 2. the settings tier, 3. the full hook, and the metrics


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
    from imexctl.platform.errors import ConfigError, NotPrivilegedError

    hook = args.command in ("prolog", "epilog")
    # the early paths never ask NVML: with no GPU given, none is made
    needs = Needs(logs="hook", gpu="none", hook_lookup=True) if hook else Needs(logs="command", gpu="none")
    t0 = time.monotonic()
    try:
        built = build(args.command, env, needs, config=args.config, verbose=args.verbose, host=host, gpu=gpu, read=read)
    except ConfigError as exc:
        if hook:
            _count_unloaded(args.command, env, exc, time.monotonic() - t0)
            _drain_unloaded(env, host, exc)
        raise
    rt, node = built.rt, built.node
    job = _job(args.command, env, read) if hook else None
    if job is not None and rt.host.euid() == 0 and _settings_tier(args.command, job, rt):
        return 0
    if rt.host.euid() != 0:
        refused = NotPrivilegedError(f"imexctl {args.command} must run as root")
        if hook:
            _drain_refused(env, rt, refused.code, str(refused))
        raise refused
    rt = with_gpu(rt)
    if on_step:
        rt = rt._replace(on_step=on_step)
    return _full(args, env, rt, job, node)


def _drain_unloaded(env: Mapping[str, str], host: Host | None, exc: Any) -> None:
    """Drain the tray with the reason of a config file that did not load, by the built-in settings (``slurm.drain``).

    So ``sinfo -R`` reads ``imex:config_invalid <tray> job <id>: <file>:<line>: ...``
    rather than ``Prolog error``; its lines go where ``runtime.build`` pointed
    the log before it raised (stderr: slurmd's log).  Never the hook's failure.
    """
    try:
        import structlog

        from imexctl.hooks.runtime import Needs, build
        from imexctl.slurm import drain

        rt = build("drain", env, Needs(logs="none", gpu="none", config="none"), host=host).rt
        drain.leave_unconfigured(rt.host, rt.settings, env, structlog.get_logger(), exc)
    except Exception:  # the reason is best effort: Slurm's own stands
        return


def _drain_refused(env: Mapping[str, str], rt: Runtime, code: str, message: str) -> None:
    """Drain the tray of a hook that may not run here (``not_root``) with its reason, by the settings that loaded."""
    from imexctl.platform.errors import ImexctlError
    from imexctl.slurm import drain
    from imexctl.slurm.job import JobContext

    try:
        job = JobContext.from_env(env, need_nodes=False)
    except ImexctlError:
        return
    text = drain.reason(code, job.node, message, job=job.job_id)
    drain.leave(rt.host, rt.settings, rt.log, node=job.node, slurm_conf=job.slurm_conf, text=text)


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
        result = _idle_prolog(job, rt)
    else:
        from imexctl.hooks.teardown import idle_epilog

        result = idle_epilog(job, rt)
    if result is None:
        return False
    _count(rt, command, result, None, rt.host.monotonic() - t0, job.node)
    return True


def _idle_prolog(job: JobContext, rt: Runtime) -> PrologResult | None:
    """The whole prolog of a job that the policy skips, with the settings; None (nothing logged) otherwise.

    The decision is ``gate.skipped_prolog``'s, with the hook's ``log.LineLogger``,
    when the fast tier could not answer (metrics to record, a log directory
    still to make, a test's fake host).  None too when the note failed: the
    full prolog logs that.
    """
    from imexctl.hooks.gate import skipped_prolog
    from imexctl.hooks.results import PrologResult
    from imexctl.hooks.runtime import bind

    t0 = rt.host.monotonic()
    skip = skipped_prolog(job, rt.settings.policy, rt.settings.node_paths)
    if skip is None or skip.problem:
        return None
    bind(rt, job_id=job.job_id, node=job.node)
    result = PrologResult(round(rt.host.monotonic() - t0, 3), skipped=skip.reason, told_user=skip.told)
    result.log(rt.log)
    return result


def _full(args: argparse.Namespace, env: Mapping[str, str], rt: Runtime, job: JobContext | None, node: str) -> int:
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
            _count(rt, args.command, result, error, rt.host.monotonic() - t0, node)
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


def _count(rt: Runtime, command: str, result: Any, error: BaseException | None, duration_s: float, node: str) -> None:
    """Update the Prometheus text file ([metrics] textfile_dir); a failure is a warning, never the run's.

    ``node`` names the tray's block in the topology source until a prolog sets up a domain (``metrics.record``).
    """
    if not rt.settings.metrics.textfile_dir:
        return
    try:
        from imexctl.hooks import metrics

        counted = metrics.run_of(command, result, error, duration_s, rt.settings.readiness.level)
        metrics.record(rt.settings, counted, rt.host.time(), node)
    except Exception as exc:  # metrics must never fail a hook
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")


def _count_unloaded(command: str, env: Mapping[str, str], error: BaseException, duration_s: float) -> None:
    """Count a hook whose config file does not load, in the fallback (``metrics.fallback``, docs/metrics.md).

    No setting of the file that failed is used; the failure's line is the
    hook's (``cli.main``), a failure to count it a warning on stderr (where
    ``runtime.build`` pointed the log before it raised), never the run's.
    """
    try:
        from imexctl.hooks import metrics
        from imexctl.slurm.job import node_name

        settings = metrics.fallback(node_name(env, or_host=True))
        if settings is not None:  # None: this tray never had metrics
            metrics.record(settings, metrics.run_of(command, None, error, duration_s, "domain"), time.time())
    except Exception as exc:  # metrics must never fail a hook
        import structlog

        structlog.get_logger().warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")
