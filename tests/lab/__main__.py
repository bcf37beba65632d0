"""Bring a lab up or down by hand, as root, from the repository root.

    /opt/imexctl/bin/python -m tests.lab up [--slurm 26.05] [--nodes N] [--dir D]  # prints SLURM_CONF
    /opt/imexctl/bin/python -m tests.lab status [--slurm 26.05] [--dir D]
    /opt/imexctl/bin/python -m tests.lab down [--slurm 26.05] [--dir D]
    /opt/imexctl/bin/python -m tests.lab root [--slurm 26.05|all] [--prune]  # build (or find) a Debian root
    /opt/imexctl/bin/python -m tests.lab up|status|down --systemd [--nodes N]  # booted nodes (sysd.py)
    /opt/imexctl/bin/python -m tests.lab churn [--slurm 26.05] [--trays 72] [--jobs 2000] [--seed S] [--fault-rate R]

``--slurm 22.05`` (the default) is the host's Slurm, ``--slurm 24.11`` Slurm from the Debian 13 root,
``--slurm 26.05`` Slurm from the Debian sid root. Each uses its own names (namespaces, bridge, subnet,
slurmctld port), so all can be up at once. ``root`` builds the Debian 13 root (the default, which the
systemd lab boots too), a version's root, or with ``--slurm all`` every root.
It installs nothing on the host. ``--systemd`` is the lab of booted nodes (systemd as PID 1, imexctl
installed by docs/install.md's commands; tests/lab/sysd.py), which can be up beside the others.
``churn`` is the long soak of issue 43 (tests/lab/churn.py): a lab of its own (its own names, beside the others)
of ``--trays`` trays in topology blocks of ``--block``, a seeded churn of ``--jobs`` jobs with faults on chosen
trays, then the oracle; it prints a summary and exits 1 on any finding (``--logs``: a copy of the lab's logs).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.lab import churn, debroot
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


def _churn(args: argparse.Namespace) -> int:
    """The long soak: a churn lab up, the plan run and checked, the lab down; 1 when the oracle found anything."""
    install = RootSlurm(debroot.ensure_root(log=log, suite=debroot.SUITES[args.slurm]).path, churn.NAMES[args.slurm])
    mix = churn.Mix(
        fault_rate=args.fault_rate,
        cancel_rate=args.cancel_rate,
        time_limit_rate=args.time_limit_rate,
        requeue_rate=args.requeue_rate,
    )
    outcome = churn.soak(
        install,
        trays=args.trays,
        block=args.block,
        blocks=True,
        jobs=args.jobs,
        seed=args.seed,
        mix=mix,
        inflight=args.inflight or max(4, args.trays // 4),
        churn_s=args.hours * 3600 if args.hours else float("inf"),
        logs=Path(args.logs) if args.logs else None,
    )
    print(churn.summary(outcome))
    if args.logs:
        print(f"logs of the lab: {args.logs}")
    return 1 if outcome.findings else 0


def _churn_parser(sub: Any) -> None:
    p = sub.add_parser("churn", help="the long soak: seeded job churn with faults on a lab of its own, then the oracle")
    p.add_argument("--slurm", choices=sorted(churn.NAMES), default="26.05")
    p.add_argument("--trays", type=int, default=72, help="trays of the lab (default 72)")
    p.add_argument("--block", type=int, default=18, help="trays per topology block (default 18, an NVL72 rack)")
    p.add_argument("--jobs", type=int, default=2000, help="jobs of the plan (default 2000)")
    p.add_argument("--seed", type=int, default=1, help="the plan's seed (default 1)")
    p.add_argument("--fault-rate", type=float, default=0.05, help="share of jobs that meet a fault (default 0.05)")
    p.add_argument("--cancel-rate", type=float, default=0.08, help="share cancelled in their prologs (default 0.08)")
    p.add_argument("--time-limit-rate", type=float, default=0.03, help="share that time out (default 0.03)")
    p.add_argument("--requeue-rate", type=float, default=0.02, help="share requeued once running (default 0.02)")
    p.add_argument("--inflight", type=int, help="jobs alive at once, at most (default: trays / 4, at least 4)")
    p.add_argument("--hours", type=float, help="stop submitting after this long (default: when the plan is done)")
    p.add_argument("--logs", help="where to copy the lab's logs (slurmctld, slurmds, imexctl and IMEX on each tray)")


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
    _churn_parser(sub)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "churn":
            return _churn(args)
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
