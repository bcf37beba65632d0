"""Command line: the console script, and ``main``, the one place that maps errors to exit codes.

The console script imports this module for every hook run: at module level it
imports only ``os`` and ``sys``.  A hook's way through is
:mod:`imexctl.hooks.entry`'s, its front door: :func:`main` first offers the
command line to its fast tier (a prolog that policy skips, an epilog with
nothing to do), then parses it (:mod:`imexctl.cli.dispatch`; argparse,
:mod:`imexctl.cli.parser`, only for a line that is not a plain hook's) and hands
a hook (and ``cleanup``) back to it, every other command to its handler
(docs/performance.md).
"""

from __future__ import annotations

import os
import sys

# typing is not imported at run time before it is needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Callable, NoReturn

    from imexctl.gpu.fabric import Gpu
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
    from imexctl.hooks.entry import hook_line

    hook = hook_line(sys.argv[1:]) is not None
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
    from imexctl.hooks import entry

    read = None
    argv = sys.argv[1:] if argv is None else argv
    if host is None and gpu is None and on_step is None:  # the tests' fakes skip the fast tier
        done, read = entry.first(argv, os.environ if env is None else env)
        if done is not None:
            return done
    from imexctl.cli.dispatch import failed, handler, parse
    from imexctl.platform import logsetup
    from imexctl.platform.errors import ExitCode, ImexctlError

    args = parse(argv)
    env = dict(os.environ) if env is None else dict(env)
    logsetup.reset_logging()
    try:
        if args.command in entry.COMMANDS:
            # read: what the fast tier read before it declined (entry.Read)
            return entry.run(args, env, host, gpu, on_step, read)
        return handler(args.command)(args, env, host, gpu)
    except ImexctlError as exc:
        return failed(args, exc)
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug: leave a structured trace, never a bare traceback in slurmd's log only
        logsetup.log_crash()
        return int(ExitCode.SOFTWARE)
