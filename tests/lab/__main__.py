"""Bring a lab up or down by hand, as root, from the repository root.

    /opt/imexctl/bin/python -m tests.lab up [--slurm 26.05] [--nodes N] [--dir D]  # prints SLURM_CONF
    /opt/imexctl/bin/python -m tests.lab status [--slurm 26.05] [--dir D]
    /opt/imexctl/bin/python -m tests.lab down [--slurm 26.05] [--dir D]
    /opt/imexctl/bin/python -m tests.lab root [--slurm 26.05|all] [--prune]  # build (or find) a Debian root
    /opt/imexctl/bin/python -m tests.lab up|status|down --systemd [--nodes N]  # booted nodes (sysd.py)

``--slurm 22.05`` (the default) is the host's Slurm, ``--slurm 24.11`` Slurm from the Debian 13 root,
``--slurm 26.05`` Slurm from the Debian sid root. Each uses its own names (namespaces, bridge, subnet,
slurmctld port), so all can be up at once. ``root`` builds the Debian 13 root (the default, which the
systemd lab boots too), a version's root, or with ``--slurm all`` every root.
It installs nothing on the host. ``--systemd`` is the lab of booted nodes (systemd as PID 1, imexctl
installed by docs/install.md's commands; tests/lab/sysd.py), which can be up beside the others.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tests.lab import debroot
from tests.lab.cluster import LabError, SlurmLab, log
from tests.lab.sysd import NAMES as SYSD_NAMES
from tests.lab.sysd import SystemdLab
from tests.lab.versions import HostSlurm, RootSlurm, SlurmInstall

VERSIONS = {"22.05": HostSlurm.NAMES, **RootSlurm.SERIES_NAMES}


def _install(version: str) -> SlurmInstall:
    if version == "22.05":
        return HostSlurm()
    return RootSlurm(debroot.ensure_root(log=log, suite=debroot.SUITES[version]).path, VERSIONS[version])


def _up(args: argparse.Namespace) -> None:
    lab = SlurmLab(_install(args.slurm), args.dir, nodes=args.nodes or 4, prolog=args.prolog, epilog=args.epilog).up()
    client = "" if args.slurm == "22.05" else f"chroot {lab.slurm.to_state()['merged']} "
    print(f"LAB={lab.dir}")
    print(f"export SLURM_CONF={lab.conf}")
    print(f"# Slurm {lab.version}; a client command: {client}sinfo")
    print(f"# imexctl: SLURMD_NODENAME=node1 {client}/opt/imexctl/bin/imexctl --config {lab.imexctl_conf} status")
    print(f"# run in a node: nsenter --net=/run/netns/{lab.netns('node1')} {client}<cmd>")
    print(f"# tear down:     python3 -m tests.lab down --slurm {args.slurm} --dir {lab.dir}")


def _systemd(args: argparse.Namespace) -> None:
    """up / status / down of the booted-node lab."""
    if args.cmd == "up":
        lab = SystemdLab(debroot.ensure_root(log=log).path, args.nodes or 2, args.dir).up()
        ctl = lab.node("ctl").init_pid
        print(f"LAB={lab.top}")
        print(f"# a client command: nsenter -t {ctl} -a sinfo")
        print(f"# a node: nsenter -t {lab.node('node1').init_pid} -a systemctl list-units 'imexctl-imex@*'")
        print("# tear down:  python3 -m tests.lab down --systemd")
        return
    try:
        state = json.loads(SYSD_NAMES.pointer.read_text())
    except (OSError, ValueError):
        if args.cmd == "status":
            raise LabError(f"no systemd lab recorded in {SYSD_NAMES.pointer}") from None
        log(f"no systemd lab recorded in {SYSD_NAMES.pointer}; removing leftovers by name")
        SystemdLab(debroot.CACHE).remove_stale()
        return
    if args.cmd == "status":
        print(json.dumps(state, indent=1, sort_keys=True))
    else:
        SystemdLab.attach(state).down()


def _down(args: argparse.Namespace) -> None:
    names = VERSIONS[args.slurm]
    try:
        lab = SlurmLab.attach(names, args.dir)
    except LabError as exc:
        log(f"{exc}; removing leftovers by name")
        # the root's path does not matter for removing leftovers
        SlurmLab(HostSlurm(names) if args.slurm == "22.05" else RootSlurm(debroot.CACHE, names)).remove_stale()
        return
    lab.down()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``up`` / ``down`` / ``status`` / ``root`` command line."""
    ap = argparse.ArgumentParser(prog="python -m tests.lab", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="bring a lab up (replacing a stale one with the same names)")
    p_up.add_argument("--nodes", type=int, help="compute nodes (default: 4; 2 with --systemd)")
    p_up.add_argument("--dir", help="lab directory (default: a new /tmp/<prefix>-XXXX); must be empty")
    p_up.add_argument("--prolog", help="Prolog script (default: this checkout's hooks/prolog)")
    p_up.add_argument("--epilog", help="Epilog script (default: this checkout's hooks/epilog)")
    for name in ("down", "status"):
        what = "tear a lab down" if name == "down" else "print a lab's state"
        p = sub.add_parser(name, help=f"{what} (default: this machine's current lab of that version)")
        p.add_argument("--dir")
    for name in ("up", "down", "status"):
        sub.choices[name].add_argument("--slurm", choices=sorted(VERSIONS), default="22.05")
    for name in ("up", "down", "status"):
        sub.choices[name].add_argument("--systemd", action="store_true", help="the lab of booted nodes")
    p_root = sub.add_parser("root", help="build a Debian root if needed and print its path")
    p_root.add_argument("--prune", action="store_true", help="also remove cached roots of other keys")
    p_root.add_argument("--slurm", choices=[*debroot.SUITES, "all"], default="24.11", help="whose root")
    args = ap.parse_args(argv)
    try:
        if getattr(args, "systemd", False):
            _systemd(args)
        elif args.cmd == "up":
            _up(args)
        elif args.cmd == "down":
            _down(args)
        elif args.cmd == "status":
            print(json.dumps(SlurmLab.attach(VERSIONS[args.slurm], args.dir).status(), indent=1, sort_keys=True))
        else:
            versions = list(debroot.SUITES) if args.slurm == "all" else [args.slurm]
            roots = [debroot.ensure_root(log=log, suite=debroot.SUITES[v]) for v in versions]
            if args.prune:
                debroot.prune(log=log)
            print("\n".join(str(root.path) for root in roots))
    except LabError as exc:
        print(f"tests.lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
