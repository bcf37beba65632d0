"""doctor's name checks: this tray's own name, and with ``--nodes`` a whole rack's, by ``[resolve] method``.

The prolog writes one address per tray into the nodes file and refuses a tray
whose own address is on none of its interfaces (:func:`members.check_own`);
these checks show the same answers before a job does.  The resolution is the
prolog's own code (:func:`members.resolve_all`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from imexctl.doctor.framework import FAIL, OK, Check, Context
from imexctl.hooks import members
from imexctl.platform.errors import ConfigError, NodeListError, ResolveError
from imexctl.slurm import nodefold, nodelist

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["checks"]


def checks(ctx: Context) -> list[Check]:
    """``resolve.self``, and ``resolve.nodes`` when doctor was given ``--nodes``."""
    method = ctx.rt.settings.resolve.method
    try:
        table = _node_addrs(ctx)
    except ConfigError as exc:
        fix = "fix slurm.conf's node lines, or pass --slurm-conf FILE"
        out = [Check("resolve.self", FAIL, f"[resolve] method = {method}: {exc}", fix)]
        return out + ([Check("resolve.nodes", FAIL, str(exc), fix)] if ctx.nodes else [])
    out = [_self(ctx, table)]
    if ctx.nodes:
        out.append(_nodes(ctx, table))
    return out


def _node_addrs(ctx: Context) -> Mapping[str, str] | None:
    """slurm.conf's NodeAddr table with ``method = slurm_conf`` (the file slurmd uses, or ``--slurm-conf``)."""
    if ctx.rt.settings.resolve.method != "slurm_conf":
        return None
    from imexctl.doctor import slurm as slurmcheck
    from imexctl.slurm import nodeaddr

    # --slurm-conf, $SLURM_CONF or /etc/slurm (as the slurm.conf checks), else slurmd's configless caches
    path = slurmcheck._find(ctx) or nodeaddr.conf_path("", ctx.rt.settings.paths.root)
    return nodeaddr.read(path)


def _resolve(ctx: Context, names: Sequence[str], table: Mapping[str, str] | None) -> tuple[str, ...]:
    s = ctx.rt.settings
    return members.resolve_all(
        names, method=s.resolve.method, host=ctx.rt.host, hosts_file=s.paths.hosts_file, node_addrs=table
    )


def _self(ctx: Context, table: Mapping[str, str] | None) -> Check:
    """This tray's name: exactly one IPv4 address (the method's rule), on one of its interfaces."""
    method = ctx.rt.settings.resolve.method
    try:
        (address,) = _resolve(ctx, [ctx.node], table)
        members.check_own(ctx.node, address, method, ctx.rt.host)
    except ResolveError as exc:
        return Check("resolve.self", FAIL, str(exc), "every prolog on this tray fails resolve_failed until it is fixed")
    return Check("resolve.self", OK, f"{ctx.node} is {address} ([resolve] method = {method}), on this tray")


def _nodes(ctx: Context, table: Mapping[str, str] | None) -> Check:
    """Every name of ``--nodes``, one by one: which fail, which share an address."""
    try:
        names = nodelist.expand(ctx.nodes)
    except NodeListError as exc:
        return Check("resolve.nodes", FAIL, f"--nodes {ctx.nodes}: {exc}", "give a Slurm host list, e.g. gb[01-18]")
    found: dict[str, str] = {}
    problems = []
    for name in names:
        try:
            (found[name],) = _resolve(ctx, [name], table)
        except ResolveError as exc:
            problems.append(str(exc).removeprefix("cannot resolve trays: "))
    by_addr: dict[str, list[str]] = {}
    for name, addr in found.items():
        by_addr.setdefault(addr, []).append(name)
    problems += [f"{nodefold.fold(ns)} all resolve to {a}" for a, ns in by_addr.items() if len(ns) > 1]
    if problems:
        fix = "fix these names for [resolve] method (every tray of a job must resolve, each to its own address)"
        return Check("resolve.nodes", FAIL, f"{len(problems)} problem(s): " + "; ".join(problems), fix)
    from imexctl.imex.config import nodes_hash

    hash_ = nodes_hash(tuple(found[n] for n in names))
    return Check(
        "resolve.nodes",
        OK,
        f"{nodefold.fold(names)}: {len(names)} distinct addresses; nodes file hash {hash_} "
        "(the same on every tray that resolves alike)",
    )
