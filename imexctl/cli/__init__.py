"""Command line: the console script, dispatch to each command's handler; the one place that maps errors to exit codes.

The console script imports this module for every hook run: at module level it
imports only ``os`` and ``sys``.  :func:`main` first offers the command line
to :mod:`imexctl.hooks.quick` (a prolog that policy skips, an epilog with nothing
to do), then parses it with :mod:`imexctl.cli.parser` (docs/performance.md).
"""

from __future__ import annotations

import os
import sys

# typing and argparse are not imported at run time before they are needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Any, Callable, NoReturn

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.errors import ImexctlError
    from imexctl.platform.host import Host

__all__ = ["console", "main"]


def console() -> NoReturn:
    """The ``imexctl`` console script: :func:`main`, and for a hook an exit without the interpreter's teardown.

    slurmd waits for the hook's process to end.  After a full prolog or
    epilog, Python's finalisation (module teardown, garbage collection of what
    the hook loaded) took 18 to 30 ms more on this machine when the hooks still
    loaded structlog and tenacity, against 2.5 ms for ``os._exit``
    (docs/performance.md).  Nothing
    of a hook's needs it: the log file is flushed line by line, state and
    config files are written atomically with fsync, and stdout and stderr are
    flushed here.  Every other command exits normally.

    A hook also runs without the cyclic garbage collector: its passes over
    what the imports create cost about 3 ms of every prolog (docs/performance.md),
    and a hook leaves little cyclic garbage (about 300 objects after a prolog
    that waited 12 s for a peer that never came; reference counting frees the
    rest).  The hook's deadline bounds its life.
    """
    from imexctl.hooks.quick import hook_args

    hook = hook_args(sys.argv[1:]) is not None
    if hook:
        import gc

        gc.disable()
    code = main()
    if not hook:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    host: Host | None = None,
    gpu: Gpu | None = None,
    on_step: Callable[[str], None] | None = None,
) -> int:
    """Run one command; returns the exit code.

    Tests call this directly, with fakes for ``host`` and ``gpu``, and
    ``on_step`` to act at each step boundary of a hook (fault injection).
    """
    read = None
    argv = sys.argv[1:] if argv is None else argv
    if host is None and gpu is None and on_step is None:
        from imexctl.hooks import quick

        try:
            done, read = quick.start(argv, os.environ if env is None else env)
        except Exception:  # a bug there must not fail a hook: the full command decides (tests call quick.run)
            done, read = None, None
        if done is not None:
            return done
    from imexctl.platform import log
    from imexctl.platform.errors import ExitCode, ImexctlError

    args = _parse(argv)
    env = dict(os.environ) if env is None else dict(env)
    log.reset_logging()
    try:
        handler = _handler(args.command)
        if handler is not None:
            return handler(args, env, host, gpu)
        # read: what the hooks' fast path read before it declined (quick.Read), for the hooks
        return _with_runtime(args, env, host, gpu, on_step, read)
    except ImexctlError as exc:
        return _failed(args, exc)
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug: leave a structured trace, never a bare traceback in slurmd's log only
        log.log_crash()
        return int(ExitCode.SOFTWARE)


def _failed(args: argparse.Namespace, exc: ImexctlError) -> int:
    """Report a command's expected failure and return its exit code.

    The hooks' failure is a structured line (slurmd's log keeps it); an admin's
    command says it in one plain line, its structured line going to the log
    file only (with ``-v``: the structured line, as before).
    """
    from imexctl.platform import log

    plain = args.command not in _STRUCTURED and not getattr(args, "verbose", False)
    if not exc.logged:
        log.log_failure(exc, stderr=not plain)
    if getattr(args, "json", False):  # every --json says its failure in the one envelope
        from imexctl.platform.output import print_json

        print_json(None, errors=[exc], indent=None if args.command == "topology" else 2)
    if plain:
        sys.stderr.write(f"{_plain_failure(args, exc)}\n")
    return int(exc.exit_code)


#: commands whose failure stays a structured line on stderr: the hooks slurmd runs (its log keeps what they say)
_STRUCTURED = frozenset({"prolog", "epilog"})


def _plain_failure(args: argparse.Namespace, exc: BaseException) -> str:
    """``imexctl status: <reason> (config_invalid, exit 78)``: one line, as an admin reads it in a terminal."""
    sub = getattr(args, "topology_command", None) or getattr(args, "hostlist_command", None)
    what = " ".join(str(x) for x in ("imexctl", args.command, sub) if x)
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return f"{what}: {reason} ({getattr(exc, 'code', 'error')}, exit {int(getattr(exc, 'exit_code', 1))})"


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line; a plain hook line (``quick.hook_args``) without building the parser.

    Building the parser of every command and parsing takes about 7 ms of a
    hook's CPU (docs/performance.md); for ``[--config FILE] [-v] prolog|epilog``
    argparse would make just these three attributes (tests/cli/test_cli.py
    holds the two equal).
    """
    from imexctl.hooks.quick import hook_args

    plain = hook_args(argv)
    if plain is None:
        from imexctl.cli.parser import build_parser

        return build_parser().parse_args(argv)
    import types
    from typing import cast

    command, config, verbose = plain
    return cast("argparse.Namespace", types.SimpleNamespace(config=config, verbose=verbose, command=command))


# command -> the module whose command(args, env, host, gpu) runs it; the hooks and cleanup run in _with_runtime
_HANDLERS = {
    "hostlist": "imexctl.commands.hostlist",
    "task-prolog": "imexctl.channels.taskprolog",
    "enroot-hook": "imexctl.channels.enroot",
    "topology": "imexctl.commands.topology",
    "doctor": "imexctl.doctor.run",
    "health": "imexctl.commands.health",
    "why": "imexctl.commands.why",
    "status": "imexctl.commands.status",
    "preflight": "imexctl.commands.preflight",
    "netcheck": "imexctl.commands.netcheck",
    "demo": "imexctl.commands.demo",
}


def _handler(command: str) -> Callable[[argparse.Namespace, Mapping[str, str], Host | None, Gpu | None], int] | None:
    """The command's handler from :data:`_HANDLERS`; None for the hooks and cleanup, which run over a runtime."""
    import importlib

    module = _HANDLERS.get(command)
    if module is None:
        return None
    if command == "demo" and not _simulator_installed():
        return lambda *_: _no_simulator()
    return importlib.import_module(module).command  # type: ignore[no-any-return]


def _simulator_installed() -> bool:
    """The .deb and the .rpm leave the simulator and the demo out (docs/install.md)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("imexctl.commands.demo", "imexctl.sim"))


def _no_simulator() -> int:
    from imexctl.platform.errors import ExitCode

    sys.stderr.write(
        "imexctl demo: the simulator is not installed here (the node packages leave it out);"
        " run the demo from a checkout (bash .ci/setup demo) or a pip install of imexctl\n"
    )
    return int(ExitCode.UNAVAILABLE)


def _with_runtime(
    args: argparse.Namespace,
    env: dict[str, str],
    host: Host | None,
    gpu: Gpu | None,
    on_step: Callable[[str], None] | None,
    read: Any = None,
) -> int:
    """Run a hook or ``cleanup`` over the runtime ``hooks.runtime.build`` makes.

    ``read`` is what the hooks' fast path read before it declined
    (``quick.Read``): the settings are then built from its validated sections
    and the job is its job, neither read again.
    """
    from imexctl.hooks.runtime import Needs, build, with_gpu
    from imexctl.platform.errors import NotPrivilegedError

    hook = args.command in ("prolog", "epilog")
    # the early paths never ask NVML: with no GPU given, none is made
    needs = Needs(logs="hook", gpu="none", hook_lookup=True) if hook else Needs(logs="command", gpu="none")
    rt = build(args.command, env, needs, config=args.config, verbose=args.verbose, host=host, gpu=gpu, read=read).rt
    job = _hook_job(args, env, read)
    if hook and job is not None and rt.host.euid() == 0 and _quick_hook(args, job, rt):
        return 0
    if rt.host.euid() != 0:
        raise NotPrivilegedError(f"imexctl {args.command} must run as root")
    rt = with_gpu(rt)
    if on_step:
        rt = rt._replace(on_step=on_step)
    return _run_hook(args, env, rt, job)


def _hook_job(args: argparse.Namespace, env: Mapping[str, str], read: Any) -> Any:
    """The hook's job, read once for the whole run: the fast path's, else from ``env``.

    None for a command that is no hook, or when the environment is invalid:
    the hook then reads it again and reports the problem, as it always does.
    """
    if args.command not in ("prolog", "epilog"):
        return None
    if read is not None:
        return read.job
    from imexctl.platform.errors import ImexctlError
    from imexctl.slurm.job import JobContext

    try:
        return JobContext.from_env(env, need_nodes=args.command == "prolog")
    except ImexctlError:
        return None


def _quick_hook(args: argparse.Namespace, job: Any, rt: Any) -> bool:
    """Finish a prolog that policy skips, or an epilog with nothing to do, before the full hook is imported.

    The decisions are the fast path's own (``gate``), here with the settings
    and the given host: a site with metrics, a log directory still to make,
    or a test's fake host comes here.
    ``rt`` carries a ``log.LineLogger`` and, when none was given, no GPU:
    these paths never ask NVML.  False (nothing logged) when the full hook
    must run (docs/performance.md).
    """
    t0 = rt.host.monotonic()
    result: Any
    if args.command == "prolog":
        from imexctl.hooks.gate import idle_prolog

        result = idle_prolog(job, rt)
    else:
        from imexctl.hooks.teardown import idle_epilog

        result = idle_epilog(job, rt)
    if result is None:
        return False
    _record_metrics(rt, args.command, result, None, rt.host.monotonic() - t0)
    return True


def _run_hook(args: argparse.Namespace, env: Mapping[str, str], rt: Any, job: Any = None) -> int:
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
            from imexctl.hooks.teardown import cleanup

            result = cleanup(rt, job_id=args.job, dry_run=args.dry_run, force=args.force)
            if args.json:
                from imexctl.platform.output import print_json

                print_json(result)
            else:
                sys.stdout.write(result.text())
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not getattr(args, "dry_run", False):
            _record_metrics(rt, args.command, result, error, rt.host.monotonic() - t0)
    return 0


def _record_metrics(rt: Any, command: str, result: Any, error: BaseException | None, duration_s: float) -> None:
    """Update the Prometheus text file ([metrics] textfile_dir); a failure is a warning, never the run's."""
    if not rt.settings.metrics.textfile_dir:
        return
    try:
        from imexctl.hooks import metrics

        run = metrics.run_of(command, result, error, duration_s, rt.settings.readiness.level)
        metrics.record(rt.settings, run, rt.host.time())
    except Exception as exc:  # metrics must never fail a hook
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")
