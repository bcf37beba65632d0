"""Which trays form this job's IMEX domain on this node, and their addresses.

Every tray of the job computes the same list from the same inputs: the job's
node list order, the optional NVLink-domain map (a Slurm ``topology.conf``
with ``BlockName=`` lines), and one resolution rule.  Nothing here depends
on which tray runs it, except choosing the tray's own block.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from imexctl import nodelist
from imexctl.errors import CommandError, ConfigError, NodeListError, ResolveError
from imexctl.fsutil import read_text_nofollow
from imexctl.host import Host

__all__ = ["domain_members", "parse_hosts_file", "parse_topology", "resolve_all"]


def parse_topology(text: str, source: str) -> dict[str, str]:
    """Map node name -> block name from ``BlockName=<b> Nodes=<hostlist>`` lines.

    Other Slurm topology lines (``BlockSizes=``, ``SwitchName=``), blank lines
    and ``#`` comments are ignored.

    Raises:
        ConfigError: a malformed block line, or a node in two blocks.
    """
    owner: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("BlockName="):
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        block, nodes = fields.get("BlockName", ""), fields.get("Nodes", "")
        if not block or not nodes:
            raise ConfigError(f"{source}:{lineno}: block line needs BlockName= and Nodes=: {line!r}")
        try:
            names = nodelist.expand(nodes)
        except NodeListError as exc:
            raise ConfigError(f"{source}:{lineno}: {exc}") from exc
        for name in names:
            if owner.setdefault(name, block) != block:
                raise ConfigError(f"{source}:{lineno}: node {name} is in blocks {owner[name]} and {block}")
    return owner


def domain_members(nodes: Sequence[str], me: str, topology_file: Path | None) -> tuple[str, ...]:
    """The job's trays that share this tray's NVLink domain, in node-list order.

    Without a topology file every tray of the job is in one domain.
    """
    if topology_file is None:
        return tuple(nodes)
    try:
        text = read_text_nofollow(topology_file, trusted=True)
    except OSError as exc:
        raise ConfigError(f"cannot read topology file {topology_file}: {exc.strerror}") from exc
    owner = parse_topology(text, str(topology_file))
    if me not in owner:
        raise ConfigError(f"{topology_file}: this node {me} is in no BlockName= block")
    return tuple(n for n in nodes if owner.get(n) == owner[me])


def parse_hosts_file(text: str, source: str) -> dict[str, str]:
    """``/etc/hosts``-style map: ``ADDRESS NAME [NAME...]`` -> {name: address}.

    Raises:
        ConfigError: a bad address, or one name given two addresses.
    """
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) < 2 or not _is_ip(fields[0]):
            raise ConfigError(f"{source}:{lineno}: expected 'ADDRESS NAME...', got {line.strip()!r}")
        for name in fields[1:]:
            if out.setdefault(name, fields[0]) != fields[0]:
                raise ConfigError(f"{source}:{lineno}: {name} has two addresses ({out[name]}, {fields[0]})")
    return out


def resolve_all(names: Sequence[str], *, method: str, host: Host, hosts_file: Path) -> tuple[str, ...]:
    """Resolve every tray to exactly one address; all must resolve, no two alike.

    ``dns``: the system resolver (NSS: /etc/hosts, DNS); the one IPv4 address
    that is not loopback, else an error (ambiguity would make trays disagree).
    ``hosts_file``: a static map, exactly as written.

    Raises:
        ResolveError: naming each tray that failed and why.
    """
    table = _hosts_table(hosts_file) if method == "hosts_file" else None
    addresses: list[str] = []
    problems: list[str] = []
    for name in names:
        try:
            addresses.append(table[name] if table is not None else _dns_one(host, name))
        except KeyError:
            problems.append(f"{name}: not in {hosts_file}")
        except ResolveError as exc:
            problems.append(str(exc))
    if problems:
        more = f"; and {len(problems) - 5} others" if len(problems) > 5 else ""
        raise ResolveError("cannot resolve trays: " + "; ".join(problems[:5]) + more)
    seen: dict[str, str] = {}
    for name, addr in zip(names, addresses):
        if addr in seen:
            raise ResolveError(f"{seen[addr]} and {name} resolve to the same address {addr}")
        seen[addr] = name
    return tuple(addresses)


def _hosts_table(path: Path) -> dict[str, str]:
    try:
        text = read_text_nofollow(path, trusted=True)
    except OSError as exc:
        raise ConfigError(f"cannot read hosts file {path}: {exc.strerror}") from exc
    return parse_hosts_file(text, str(path))


def _dns_one(host: Host, name: str) -> str:
    try:
        found = host.resolve(name)
    except CommandError as exc:
        raise ResolveError(f"{name}: {exc.reason}") from exc
    usable = [a for a in found if _usable(a)]
    if len(usable) == 1:
        return usable[0]
    if not usable:
        raise ResolveError(f"{name}: no non-loopback IPv4 address (0.0.0.0, multicast and reserved ones do not "
                           f"count; resolver gave {found or 'nothing'})")  # fmt: skip
    raise ResolveError(f"{name}: ambiguous, several IPv4 addresses {usable}; use [resolve] method = hosts_file")


def _usable(text: str) -> bool:
    """An IPv4 address a daemon can bind and its peers can reach (a DNS sink's 0.0.0.0 is not one)."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return False
    return addr.version == 4 and not (addr.is_loopback or addr.is_unspecified or addr.is_multicast or addr.is_reserved)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
