"""``imexctl topology`` (this tray's NVLink domain) and ``imexctl topology blocks`` (Slurm blocks from many trays)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from imexctl.platform.errors import ExitCode, GpuError, ReportError
from imexctl.platform.output import print_json

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping, Sequence

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host
    from imexctl.slurm.blocks import BlockNames, Report

__all__ = ["command"]


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, gpu: Gpu | None) -> int:
    """``imexctl topology``: needs no config and no root; NVML failing is exit 69 with a clean answer."""
    if args.topology_command == "blocks":
        return _blocks(args)
    from imexctl.gpu import topology
    from imexctl.hooks.runtime import Needs, build

    # no config file and no log: NVML alone
    built = build("topology", env, Needs(logs="none", config="none"), node=args.node, host=_host, gpu=gpu)
    tray = topology.read_tray(built.rt.gpu, built.node)
    errors = [GpuError(tray.error)] if tray.error else []
    if args.json:
        print_json(tray, errors=errors, indent=None)
    else:
        sys.stdout.write(topology.render_text(tray))
    return int(GpuError.exit_code) if errors else 0


def _blocks(args: argparse.Namespace) -> int:
    """``imexctl topology blocks``: exit 69 (after printing) when a node's report says NVML failed."""
    from imexctl.slurm import blocks

    names = _names(args)
    collected = blocks.collect(_read_reports(args.files or ["-"]))
    found = blocks.group(collected)
    if names is not None:
        found = blocks.name_blocks(found, names)
    sizes = args.block_sizes or ()
    if args.map:
        sys.stdout.write(blocks.render_map(collected))
    elif args.yaml:
        sys.stdout.write(blocks.render_yaml(found, collected, sizes, args.topology_name))
    else:
        sys.stdout.write(blocks.render_conf(found, collected, sizes))
    notes = [] if args.map else blocks.size_warnings(found, sizes)
    if collected.no_fabric:
        fold = blocks.fold_names(collected.no_fabric)
        notes.append(f"{len(collected.no_fabric)} node(s) without multi-node NVLink fabric, in no block: {fold}")
    notes += [f"{node}: no answer, in no block: {why}" for node, why in sorted(collected.failed.items())]
    sys.stderr.write("".join(f"imexctl topology blocks: {line}\n" for line in notes))
    return int(ExitCode.UNAVAILABLE) if collected.failed else 0


def _names(args: argparse.Namespace) -> BlockNames | None:
    """The site's block names (``--names FILE``, ``--name-pattern REGEX``); None for the names made from the keys."""
    from imexctl.slurm import blocks

    if not args.names and args.name_pattern is None:
        return None
    names = blocks.BlockNames({}, {})
    if args.names:
        try:
            text = Path(args.names).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"cannot read {args.names}: {exc}") from exc
        names = blocks.parse_names(text, args.names)
    return names._replace(pattern=args.name_pattern)


def _read_reports(files: Sequence[str]) -> Iterator[Report]:
    from imexctl.slurm import blocks

    for name in files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"cannot read {name}: {exc}") from exc
        for lineno, line in enumerate(text.splitlines(), 1):
            report = blocks.parse_line(line, f"{'stdin' if name == '-' else name}:{lineno}")
            if report is not None:
                yield report
