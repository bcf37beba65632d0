"""``imexctl hostlist``: expand or fold Slurm node lists (no slurmctld needed)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from imexctl.slurm import nodefold, nodelist

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["command"]


def command(args: argparse.Namespace, _env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``expand``: one host per line; ``fold``: one compressed list (names from stdin when none given)."""
    if args.hostlist_command == "expand":
        names = [n for expr in args.expr for n in nodelist.expand(expr)]
        sys.stdout.write("".join(f"{n}\n" for n in names))
        return 0
    names = args.names or sys.stdin.read().split()
    if names:
        sys.stdout.write(nodefold.fold(names) + "\n")
    return 0
