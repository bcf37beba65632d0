"""The command line past the hooks' fast tier: parsing, which module runs each command, how a failure reads.

:mod:`imexctl.cli` (``main``) comes here only when the fast tier did not
finish the run; a hook that policy skips never loads this module
(docs/performance.md "Hook start-up").
"""

from __future__ import annotations

import sys

# typing and argparse are not imported at run time before they are needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from typing import Callable

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.errors import ImexctlError
    from imexctl.platform.host import Host

__all__ = ["failed", "handler", "parse"]


def failed(args: argparse.Namespace, exc: ImexctlError) -> int:
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


def parse(argv: Sequence[str]) -> argparse.Namespace:
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
    "drains": "imexctl.commands.drains",
    "why": "imexctl.commands.why",
    "status": "imexctl.commands.status",
    "preflight": "imexctl.commands.preflight",
    "netcheck": "imexctl.commands.netcheck",
    "demo": "imexctl.commands.demo",
}


def handler(command: str) -> Callable[[argparse.Namespace, Mapping[str, str], Host | None, Gpu | None], int]:
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
