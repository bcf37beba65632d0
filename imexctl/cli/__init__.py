"""Command line: the console script, parsing, dispatch; the one place that maps errors to exit codes.

The console script imports this module for every hook run: at module level it
imports only ``os`` and ``sys``.  A hook's way through is
:mod:`imexctl.hooks.entry`'s, its front door: :func:`main` first offers the
command line to its fast tier (a prolog that policy skips, an epilog with
nothing to do), then parses it (argparse, :mod:`imexctl.cli.parser`, only for a
line that is not a plain hook's) and hands a hook (and ``cleanup``) back to it,
every other command to its handler (docs/performance.md).
"""

from __future__ import annotations

import os
import sys

# typing and argparse are not imported at run time before they are needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Callable, NoReturn

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
    from imexctl.platform import logsetup
    from imexctl.platform.errors import ExitCode, ImexctlError

    args = _parse(argv)
    env = dict(os.environ) if env is None else dict(env)
    logsetup.reset_logging()
    try:
        if args.command in entry.COMMANDS:
            # read: what the fast tier read before it declined (entry.Read)
            return entry.run(args, env, host, gpu, on_step, read)
        return _handler(args.command)(args, env, host, gpu)
    except ImexctlError as exc:
        return _failed(args, exc)
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug: leave a structured trace, never a bare traceback in slurmd's log only
        logsetup.log_crash()
        return int(ExitCode.SOFTWARE)


def _failed(args: argparse.Namespace, exc: ImexctlError) -> int:
    """Report a command's expected failure and return its exit code.

    The hooks' failure is a structured line (slurmd's log keeps it); an admin's
    command says it in one plain line, its structured line going to the log
    file only (with ``-v``: the structured line, as before).
    """
    from imexctl.platform import logsetup

    plain = args.command not in _STRUCTURED and not getattr(args, "verbose", False)
    if not exc.logged:
        logsetup.log_failure(exc, stderr=not plain)
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
    """The parsed command line; a plain hook line (``entry.hook_line``) without building the parser.

    Building the parser of every command and parsing takes about 7 ms of a
    hook's CPU (docs/performance.md); for ``[--config FILE] [-v] prolog|epilog``
    argparse would make just these three attributes (tests/cli/test_cli.py
    holds the two equal).
    """
    from imexctl.hooks.entry import hook_line

    plain = hook_line(argv)
    if plain is None:
        from imexctl.cli.parser import build_parser

        return build_parser().parse_args(argv)
    import types
    from typing import cast

    command, config, verbose = plain
    return cast("argparse.Namespace", types.SimpleNamespace(config=config, verbose=verbose, command=command))


# command -> the module whose command(args, env, host, gpu) runs it; the hooks and cleanup: hooks.entry.run
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


def _handler(command: str) -> Callable[[argparse.Namespace, Mapping[str, str], Host | None, Gpu | None], int]:
    """The command's handler from :data:`_HANDLERS` (the parser knows no other command)."""
    import importlib

    module = _HANDLERS[command]
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
