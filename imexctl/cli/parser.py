"""The command line's grammar: every command, option and help text (``imexctl --help``, imexctl(8)).

:mod:`imexctl.cli.reference` generates the man page from :func:`build_parser`.
argparse is imported when a parser is built, never at import time (docs/performance.md).
"""

from __future__ import annotations

import sys

from imexctl import __version__

# argparse and typing are not imported at run time before they are needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, NoReturn

__all__ = ["build_parser"]

HOOK_HELP = "reads the job from slurmd's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME, ...)"


def _top_parser() -> argparse.ArgumentParser:
    """The top-level parser: the sysexits usage code (64) instead of 2, and the exit codes in ``--help``."""
    import argparse

    from imexctl.platform.errors import ExitCode

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            self.print_usage(sys.stderr)
            self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message}\n")

    epilog = "exit codes: " + "; ".join(f"{int(c)} {c.meaning}" for c in ExitCode) + " (docs/exit-codes.md)."
    return _Parser(prog="imexctl", description="Per-job NVIDIA IMEX domains for Slurm.", epilog=epilog)


def _version() -> str:
    """``--version``'s line, as the fast tier prints it: the package's version in use and one installed beside it."""
    from imexctl.platform import versions

    return versions.version_line(versions.read(), __version__)


def build_parser() -> argparse.ArgumentParser:
    """Every command and option of ``imexctl`` (``cli.main`` parses with it, imexctl(8) is generated from it)."""
    p = _top_parser()
    p.add_argument("--version", action="version", version=_version())
    p.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default: $IMEXCTL_CONFIG, imexctl.conf beside $SLURM_CONF, /etc/imexctl/imexctl.conf)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also print info-level log lines on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("prolog", help="set up this job's IMEX domain (Slurm Prolog=)", description=HOOK_HELP)
    sub.add_parser("epilog", help="tear down this job's IMEX domain (Slurm Epilog=)", description=HOOK_HELP)
    _status_parser(sub)
    dr = sub.add_parser("doctor", help="check this tray and slurm.conf before a job does (exit 1 on a FAIL)")
    dr.add_argument("--json", action="store_true", help="the checks as JSON: name, status, message, fix")
    dr.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf to check (default: $SLURM_CONF, /etc/slurm)")
    dr.add_argument("--nodes", metavar="LIST", default="", help="also resolve these trays (a host list, e.g. a rack)")
    _health_parser(sub)
    _drains_parser(sub)
    _preflight_parser(sub)
    _netcheck_parser(sub)
    cl = sub.add_parser("cleanup", help="reset the node after failed jobs")
    cl.add_argument("--job", type=int, metavar="ID", help="only this job")
    cl.add_argument("--dry-run", action="store_true", help="show what would be done")
    cl.add_argument("--force", action="store_true", help="also tear down jobs that still run here")
    cl.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    hl = sub.add_parser("hostlist", help="expand or fold Slurm node lists (no slurmctld needed)")
    hsub = hl.add_subparsers(dest="hostlist_command", metavar="ACTION", required=True)
    ex = hsub.add_parser("expand", help="one host per line, like 'scontrol show hostnames'")
    ex.add_argument("expr", nargs="+", metavar="EXPR")
    fo = hsub.add_parser("fold", help="compressed list, like 'scontrol show hostlist'")
    fo.add_argument("names", nargs="*", metavar="NAME", help="names (default: read from stdin)")
    _container_parsers(sub)
    _topology_parser(sub)
    de = sub.add_parser("demo", help="run a multi-tray job on the IMEX simulator (no GPU needed)")
    de.add_argument("--trays", type=int, default=4, metavar="N", help="simulated trays (default 4, at most 64)")
    de.add_argument("--fault", metavar="NAME", help="inject a simulator fault (see 'imexctl demo --help')")
    de.add_argument("--keep", action="store_true", help="keep the demo's temporary directory")
    return p


def _health_parser(sub: Any) -> None:
    he = sub.add_parser(
        "health",
        help="judge this tray's faults in a second, drain or resume it (Slurm HealthCheckProgram; exit 1 on a fault)",
        description="reads SLURMD_NODENAME and SLURM_NODE_IS_HEALTHY as slurmd gives them (docs/operations.md)",
    )
    he.add_argument("--json", action="store_true", help="the findings and what was done in Slurm, as JSON")
    judge_only = he.add_mutually_exclusive_group()
    judge_only.add_argument(
        "--check-only",
        action="store_true",
        help="judge and report only: never ask or change Slurm (NHC, cron); kernel evidence stays pending",
    )
    judge_only.add_argument(
        "--acknowledge",
        action="store_true",
        help="as --check-only, and let go of the kernel evidence kept pending (imex_shutdown), once the job that"
        " lost its daemon has ended on every tray (NHC then resumes the node); logged",
    )
    he.add_argument(
        "--node", type=_node_name, metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME, short host name)"
    )
    _why_parser(sub)


def _drains_parser(sub: Any) -> None:
    dr = sub.add_parser(
        "drains",
        help="the cluster's drained trays by reason code and block, and the command that says why (sinfo; any user)",
        description="reads sinfo, and the topology source the hooks read for the blocks (docs/troubleshooting.md)",
    )
    dr.add_argument("--json", action="store_true", help="every drained tray, the groups and the commands, as JSON")


def _status_parser(sub: Any) -> None:
    st = sub.add_parser("status", help="show this node's IMEX domain, channels and stale state")
    form = st.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    form.add_argument(
        "--prometheus", action="store_true", help="the live gauges in Prometheus text format (what --textfile writes)"
    )
    form.add_argument(
        "--textfile",
        action="store_true",
        help="replace [metrics] textfile_dir/imexctl-live.prom with the live gauges (imexctl-metrics.timer)",
    )


def _why_parser(sub: Any) -> None:
    wh = sub.add_parser(
        "why",
        help="what happened to a job on this tray, from imexctl's log (skipped, set up, failed, ...), or on each tray"
        " from a log host's files (--log)",
    )
    wh.add_argument("job", type=_job_id, metavar="JOBID", help="the Slurm job id")
    wh.add_argument("--json", action="store_true", help="the job's events and outcomes as JSON")
    wh.add_argument(
        "--log",
        action="append",
        metavar="FILE",
        help="read FILE instead of this tray's log, no config needed ('-': stdin; gzip; again for more files):"
        " forwarded syslog (RFC 3164, RFC 5424), journalctl -o json or -o cat, imexctl.log; told per tray",
    )


def _netcheck_parser(sub: Any) -> None:
    nc = sub.add_parser(
        "netcheck",
        help="prove both per-job port ranges are open between trays (srun -N<n> --ntasks-per-node=1, any user)",
    )
    nc.add_argument("--timeout", type=float, default=15.0, metavar="S", help="retry window per pair (default 15 s)")
    nc.add_argument(
        "--json", action="store_true", help="this tray's ports and outcomes (first tray: the matrix) as JSON"
    )


def _topology_parser(sub: Any) -> None:
    tp = sub.add_parser("topology", help="this tray's NVLink domain from NVML ('blocks': Slurm blocks from many trays)")
    tp.add_argument("--json", action="store_true", help="one JSON object on one line (what 'topology blocks' reads)")
    tp.add_argument(
        "--node",
        type=_node_name,
        metavar="NAME",
        help="node name to report (default: $SLURMD_NODENAME, short host name)",
    )
    tsub = tp.add_subparsers(dest="topology_command", metavar="ACTION")
    bl = tsub.add_parser("blocks", help="Slurm topology blocks from 'imexctl topology' reports of many trays")
    bl.add_argument("files", nargs="*", metavar="FILE", help="report files (default and '-': stdin)")
    form = bl.add_mutually_exclusive_group()
    form.add_argument("--yaml", action="store_true", help="topology.yaml (Slurm 25.05+) instead of topology.conf")
    form.add_argument("--map", action="store_true", help="a NODE KEY map (for source = map, topology_map)")
    bl.add_argument("--block-sizes", type=_block_sizes, metavar="N[,N...]", help="BlockSizes to write, e.g. 18")
    bl.add_argument("--topology-name", default="nvlink", metavar="NAME", help="with --yaml: its name (default nvlink)")
    bl.add_argument(
        "--names",
        metavar="FILE",
        help="block names: 'NAME KEY' or 'NAME NODES' lines (e.g. 'r01 gb200-r01-t[01-18]')",
    )
    bl.add_argument(
        "--name-pattern",
        type=_name_pattern,
        metavar="REGEX",
        help="block names from the node names: the one group of REGEX over a whole name, e.g. 'gb200-(r\\d+)-t\\d+'",
    )


def _node_name(text: str) -> str:
    import argparse

    from imexctl.platform.errors import NodeListError
    from imexctl.slurm import nodefold

    try:
        nodefold.fold([text])
    except NodeListError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not one node name: {exc.reason}") from None
    return text


def _job_id(text: str) -> int:
    import argparse

    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**32:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a Slurm job id (1 to 4294967295)")
    return int(text)


def _block_sizes(text: str) -> tuple[int, ...]:
    import argparse

    from imexctl.slurm.blocks import parse_block_sizes

    try:
        return parse_block_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _name_pattern(text: str) -> Any:
    import argparse

    from imexctl.slurm.blocks import parse_pattern

    try:
        return parse_pattern(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _preflight_parser(sub: Any) -> None:
    """``imexctl preflight``: what a package asks a new version before it switches to it."""
    pf = sub.add_parser(
        "preflight",
        help="would this version's hooks work here: the config parses, nvidia-imex matches the driver",
        description=(
            "what the packages ask a new version before they switch to it: the config the hooks read, by this "
            "version's reader; on the booted tray, nvidia-imex --version against the loaded driver. One line; "
            "exit 0, 78 (config) or 69 (docs/operations.md)"
        ),
    )
    pf.add_argument(
        "--config-only",
        action="store_true",
        help="judge only the config file (the Ansible role's check of a file before it writes it: --config FILE)",
    )


def _container_parsers(sub: Any) -> None:
    """The job user's commands (docs/containers.md)."""
    sub.add_parser(
        "task-prolog",
        help="print 'export NVIDIA_IMEX_CHANNELS=<N>' for a task of a job with a channel here (Slurm TaskProlog=)",
        description="runs as the job's user; always exits 0 and never writes to stderr (docs/containers.md)",
    )
    sub.add_parser(
        "enroot-hook",
        help="show an enroot container exactly the job's IMEX channel (/etc/enroot/hooks.d)",
        description="reads ENROOT_ROOTFS, ENROOT_ENVIRON and SLURM_JOB_ID (docs/containers.md)",
    )
