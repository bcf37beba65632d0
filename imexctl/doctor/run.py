"""``imexctl doctor``: find what would fail a job's prolog on this tray, before a job does.

The exit code is 0 when nothing FAILs; the node health check is ``imexctl
health`` (:mod:`imexctl.commands.health`), which judges only faults of the
tray.  Doctor only reads: it starts, stops and writes
nothing, and every file it reads is taken under ``[paths] root`` so tests can
give it a whole fake ``/proc``, ``/sys`` and ``/etc``.  This module runs every
check group in a fixed order; docs/operations.md lists the checks.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Final

from imexctl.doctor import checks as itself
from imexctl.doctor import containers
from imexctl.doctor import host as hostcheck
from imexctl.doctor import resolve as resolvecheck
from imexctl.doctor import slurm as slurmcheck
from imexctl.doctor.framework import FAIL, Check, CheckFn, Context, Report, exit_code, render_text, under_root
from imexctl.platform.errors import ImexctlError
from imexctl.platform.output import print_json

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["CHECK_NAMES", "command", "run"]

#: every check's name, in report order (``nvml.gpu<N>`` stands for one per GPU); docs/operations.md lists them
CHECK_NAMES: Final = (
    "imexctl.version",
    "imexctl.config",
    "imexctl.config_files",
    "imexctl.auth",
    "imexctl.dirs",
    "imexctl.logs",
    "imexctl.log_dir",
    "imexctl.metrics_dir",
    "imexctl.stale",
    "imexctl.channels",
    "slurm.conf",
    "slurm.version",
    "slurm.prolog",
    "slurm.epilog",
    "slurm.prolog_flags",
    "slurm.prolog_timeout",
    "slurm.epilog_timeout",
    "slurm.batch_start_timeout",
    "slurm.timeout_keys",
    "slurm.partitions",
    "slurm.preempt",
    "slurm.switch",
    "slurm.topology",
    "resolve.self",
    "resolve.nodes",
    "imex.binaries",
    "imex.version",
    "imex.held",
    "imex.stock_unit",
    "imex.unit",
    "imex.dcgm",
    "imex.channel_device",
    "imex.channel_count",
    "ports.ephemeral",
    "ports.listening",
    "ports.guard",
    "nvml.fabric",
    "nvml.gpu<N>",
    "containers.toolkit",
    "containers.toolkit.version",
    "containers.toolkit.config",
    "containers.toolkit.imex_requests",
    "containers.toolkit.imex_creation",
    "containers.toolkit.unprivileged_env",
    "containers.cdi",
    "containers.enroot",
    "containers.enroot.hook",
    "containers.enroot.other_hooks",
    "containers.enroot.environment",
    "containers.channel0",
)
_COMMAND_TIMEOUT_S: Final = 10.0


def run(ctx: Context) -> list[Check]:
    """Every check, in a fixed order; a check that breaks is reported as a FAIL, never raised."""
    groups: list[tuple[str, CheckFn]] = [
        ("imexctl.version", itself.version_checks),
        ("imexctl.config", itself.config_checks),
        ("imexctl.auth", itself.auth_checks),
        ("imexctl.dirs", itself.dir_checks),
        ("imexctl.logs", itself.log_checks),
        ("imexctl.log_dir", itself.writable_dir_checks),
        ("imexctl.stale", itself.stale_checks),
        ("slurm", slurmcheck.checks),
        ("resolve", resolvecheck.checks),
        ("imex", hostcheck.imex_checks),
        ("ports", hostcheck.port_checks),
        ("nvml", hostcheck.nvml_checks),
        ("containers", _containers),
    ]
    out: list[Check] = []
    for name, fn in groups:
        try:
            out += fn(ctx)
        except Exception as exc:  # one broken check must not hide the others
            why = str(exc) if isinstance(exc, ImexctlError) else f"{type(exc).__name__}: {exc}"
            out.append(Check(name, FAIL, f"the check could not run: {why}", "see the message; run as root"))
    # one line each: a command's stderr may have several
    return [dataclasses.replace(c, message=" ".join(c.message.split())) for c in out]


def _containers(ctx: Context) -> list[Check]:
    """The container runtimes' IMEX settings (imexctl/doctor/containers.py; docs/containers.md)."""
    paths = ctx.rt.settings.paths
    ctk = under_root(ctx, containers.TOOLKIT_VERSION_ARGV[0])
    version = None
    if ctk.is_file():
        try:
            done = ctx.rt.host.run((str(ctk), *containers.TOOLKIT_VERSION_ARGV[1:]), timeout_s=_COMMAND_TIMEOUT_S)
            version = done.stdout
        except ImexctlError as exc:
            version = f"(could not run: {exc})"
    return containers.run_all(paths.root, channel_dir=paths.channel_dir, toolkit_version=version)


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, gpu: Gpu | None) -> int:
    """``imexctl doctor``: a broken config is one FAIL among the checks (they then use the defaults)."""
    from pathlib import Path

    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import DoctorFailed

    # the file the hooks read under slurmd (issue 23); doctor only reads: no log file, warnings on stderr
    needs = Needs(logs="stderr", config="lenient")
    built = build("doctor", env, needs, config=args.config, verbose=args.verbose, host=host, gpu=gpu)
    rt, node, problem, lookup = built.rt, built.node, built.problem, built.lookup
    conf = Path(args.slurm_conf) if args.slurm_conf else None
    found = run(Context(rt, lookup, node, conf, problem, args.nodes, args.config or ""))
    report = Report(tuple(found))
    if args.json:
        failed = report.failed
        print_json(report, errors=[DoctorFailed(f"failed: {', '.join(failed)}")] if failed else [])
    else:
        sys.stdout.write(render_text(found))
    return exit_code(found)
