"""Which trays form this job's IMEX domain on this node, and their addresses.

Every tray of the job computes the same list from the same inputs: the job's
node list order, the optional NVLink-domain source (``[topology] source``:
Slurm blocks or a ``NODE KEY`` map, :mod:`imexctl.slurm.topofile`), and one
resolution rule.  Nothing here depends on which tray runs it, except choosing
the tray's own block and checking the tray's own NVML key against the source.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from imexctl.config.settings import Settings
from imexctl.platform import Record
from imexctl.platform.errors import CommandError, ConfigError, ResolveError, TopologyMismatch
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.platform.host import Host
from imexctl.slurm import nodefold, topofile
from imexctl.slurm.topofile import BlockMap

__all__ = [
    "Place",
    "block_label",
    "channel_place",
    "check_own",
    "cliques",
    "cross_check",
    "domain_members",
    "job_domain",
    "keyless_blocks",
    "largest_clique",
    "load_map",
    "load_source",
    "name_key",
    "parse_hosts_file",
    "resolve_all",
]


def job_domain(
    nodes: Sequence[str],
    me: str,
    settings: Settings,
    nvml_key: str | None,
    log: Any,
    source: BlockMap | bool | None = True,
) -> tuple[str, ...]:
    """This tray's domain members, after checking its NVML key against the configured source.

    Reads ``[topology] source`` (``[paths] topology_file``) and ``[paths]
    topology_map``; touches nothing else, so a failure here happens before the
    prolog takes the lock or writes a file.  A job over several NVLink domains
    logs ``imex.domain.split`` with the domain this tray joined.  ``source``:
    the source as the caller already read it (:func:`load_source`), else read here.

    Raises:
        ConfigError: a source that cannot be read or parsed, this node in no block or not in the map.
        TopologyMismatch: the source gives this tray another key than NVML.
    """
    if source is True or source is False:  # not given: read here
        source = load_source(settings)
    trays = domain_members(nodes, me, source)
    checks = [(source, False)] if source is not None else []
    key_map = load_map(settings)
    if key_map is not None:
        checks.append((key_map, True))
    cross_check(me, nvml_key, checks)
    if source is not None:
        _log_split(nodes, me, source, len(trays), nvml_key, log)
    return trays


def load_source(settings: Settings) -> BlockMap | None:
    """The configured topology source (``[topology] source``, ``[paths] topology_file``); None without one.

    Raises:
        ConfigError: the file cannot be read or parsed.
    """
    topo, paths = settings.topology, settings.paths
    if topo.source == "none" or paths.topology_file is None:
        return None
    return topofile.load(topo.source, paths.topology_file, topo.yaml_topology)


def load_map(settings: Settings) -> BlockMap | None:
    """``[paths] topology_map``, the ``NODE KEY`` map of every tray's NVLink domain key; None without one.

    Raises:
        ConfigError: the file cannot be read or parsed.
    """
    path = settings.paths.topology_map
    return None if path is None else topofile.load("map", path)


def block_label(me: str, source: BlockMap | None, key: str | None) -> str:
    """This tray's block as the metrics name it: its block in the source, else the name made from its key.

    A map's blocks are keys, named as ``topology blocks`` names them
    (``nvl-4f2a9c1e-7``); '' where neither is known (no source, no NVML).
    """
    block = source.block_of.get(me, "") if source is not None else ""
    if block and source is not None and source.unit == topofile.MAP_UNIT:
        return topofile.short_name(block)  # a map's blocks are its keys
    return block or (topofile.short_name(key) if key else "")


def domain_members(nodes: Sequence[str], me: str, source: BlockMap | None) -> tuple[str, ...]:
    """The job's trays that share this tray's NVLink domain, in node-list order.

    Without a source every tray of the job is in one domain.  Job nodes in no
    block are in no domain (their own prologs fail).

    Raises:
        ConfigError: this node is in no block of the source.
    """
    if source is None:
        return tuple(nodes)
    mine = source.block_of.get(me)
    if mine is None:
        raise ConfigError(f"{source.source}: this node {me} is in no {source.unit} (in no NVLink domain)")
    return tuple(n for n in nodes if source.block_of.get(n) == mine)


class Place(Record):
    """Where a domain stands in its NVLink clique, for its channel number (``devices.channel_minor``)."""

    #: the place of the domain's first tray among the clique's trays, from 0
    position: int
    #: how many trays the clique has
    trays: int
    #: what the clique is, for the log: ``block b1``, ``every block of <file>``, ``slurm.conf``, ``none``
    clique: str
    #: why the domain has no place (then position 0 of a clique of 1: the job-id rule); '' when it has one
    unplaced: str = ""


def channel_place(
    trays: Sequence[str], source: BlockMap | None, slurm_nodes: Sequence[str] | None, key_map: BlockMap | None = None
) -> Place:
    """Where the domain of ``trays`` stands in its NVLink clique: every tray of the domain computes the same.

    With a topology source the clique is the domain's block merged with every
    block of the same NVLink domain key (:func:`cliques`: a clique split over
    several blocks), its trays sorted by name: the same order on every tray
    whatever the order of the file.  ``key_map`` is ``[paths] topology_map``,
    which gives keys to a file's blocks.  Without a source the trays' NVLink
    cliques are unknown, so the clique is every node of slurm.conf, in
    Slurm's order (``slurm_nodes``); without that list, or with a tray it
    does not name (a dynamic node), the domain has no place.
    """
    if source is not None:
        clique, name = _clique_of(source, trays[0], key_map)
        where = {n: i for i, n in enumerate(clique)}
    elif slurm_nodes is None:
        return Place(0, 1, "none", "no topology source and no slurm.conf")
    else:
        where, name = {n: i for i, n in enumerate(slurm_nodes)}, "slurm.conf"
        missing = [t for t in trays if t not in where]
        if missing:
            return Place(0, 1, "none", f"no topology source, and slurm.conf does not list {nodefold.fold(missing)}")
    return Place(min(where[t] for t in trays), len(where), name)


def largest_clique(source: BlockMap, key_map: BlockMap | None = None) -> int:
    """How many trays the largest NVLink clique of the source has (its channel numbers wrap beyond the count)."""
    return max((len(c) for c in cliques(source, key_map)), default=0)


def cliques(source: BlockMap, key_map: BlockMap | None = None) -> list[list[str]]:
    """The source's NVLink cliques, each its trays sorted by name: blocks merged by their NVLink domain keys.

    A block's keys are its ``imexctl-key`` (a map's blocks are keys) and,
    with ``key_map`` (``[paths] topology_map``), the keys the map gives its
    trays; blocks that share a key are one clique.  When some block has no
    key (:func:`keyless_blocks`) nothing tells which blocks it shares a
    clique with: then the whole source is one clique, every tray of it.
    """
    keys = _block_keys(source, key_map)
    if not all(keys.values()):
        return [sorted(source.block_of)]
    groups: list[tuple[set[str], set[str]]] = []  # (keys, blocks) of each clique found so far
    for block in sorted(keys):
        linked = [g for g in groups if g[0] & keys[block]]
        merged = (keys[block].union(*(g[0] for g in linked)), {block}.union(*(g[1] for g in linked)))
        groups = [*(g for g in groups if g not in linked), merged]
    return sorted(sorted(n for n, b in source.block_of.items() if b in blocks) for _, blocks in groups)


def keyless_blocks(source: BlockMap, key_map: BlockMap | None = None) -> list[str]:
    """The blocks without an NVLink domain key: no ``imexctl-key``, and not every tray of them in ``key_map``."""
    return sorted(block for block, keys in _block_keys(source, key_map).items() if not keys)


def _block_keys(source: BlockMap, key_map: BlockMap | None) -> dict[str, set[str]]:
    """Each block's keys: its own, and those ``key_map`` gives its trays when it gives every one of them a key."""
    trays: dict[str, list[str]] = {}
    for node, block in source.block_of.items():
        trays.setdefault(block, []).append(node)
    out: dict[str, set[str]] = {}
    for block, nodes in trays.items():
        own = source.keys.get(block)
        keys = {own} if own else set()
        mapped = [key_map.key_of(n) for n in nodes] if key_map is not None else [None]
        if all(mapped):
            keys.update(k for k in mapped if k)
        out[block] = keys
    return out


def _clique_of(source: BlockMap, tray: str, key_map: BlockMap | None) -> tuple[list[str], str]:
    """The sorted trays of ``tray``'s clique (:func:`cliques`), and its name for the log."""
    clique = next(c for c in cliques(source, key_map) if tray in c)
    whole = keyless_blocks(source, key_map)
    return clique, f"every block of {source.source}" if whole else f"block {source.block_of[tray]}"


def cross_check(me: str, nvml_key: str | None, sources: Sequence[tuple[BlockMap, bool]]) -> None:
    """Refuse a tray whose NVML key differs from the key a source gives it.

    Args:
        me: this node.
        nvml_key: this tray's key from NVML; None (no NVML check) skips the check.
        sources: each source, and whether it must name this node (a map given only for the check).

    Raises:
        TopologyMismatch: naming both keys and the source.
        ConfigError: a source that must name this node does not.
    """
    if nvml_key is None:
        return
    for source, required in sources:
        expected = source.key_of(me)
        if expected is None and required:
            raise ConfigError(f"{source.source}: this node {me} is not in the NVLink domain map")
        if expected is not None and expected != nvml_key:
            raise TopologyMismatch(
                f"this tray ({me}) is in NVLink domain {nvml_key} (NVML), but {source.source} puts it in "
                f"{expected} (block {source.block_of[me]}); refusing IMEX before starting anything: "
                f"regenerate the topology file (imexctl topology blocks) or check the tray"
            )


def _log_split(nodes: Sequence[str], me: str, source: BlockMap, trays: int, key: str | None, log: Any) -> None:
    """One line per tray when the job spans several domains (or has nodes in none)."""
    domains = {source.block_of[n] for n in nodes if n in source.block_of}
    outside = [n for n in nodes if n not in source.block_of]
    if len(domains) > 1 or outside:
        log.info(
            "imex.domain.split",
            domain=source.block_of[me],
            key=key or source.key_of(me),
            trays=trays,
            domains=len(domains),
            outside=nodefold.fold(outside),
        )


def parse_hosts_file(text: str, source: str) -> dict[str, str]:
    """``/etc/hosts``-style map: ``ADDRESS NAME [NAME...]`` -> {name: address}, names in lower case.

    Names are matched without regard to case, as glibc's ``files`` source
    matches /etc/hosts (``strcasecmp``): ``GB01`` and ``gb01`` are one name,
    looked up with :func:`name_key`.

    Raises:
        ConfigError: a bad address, or one name (in any case) given two addresses.
    """
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) < 2 or not _is_ip(fields[0]):
            raise ConfigError(f"{source}:{lineno}: expected 'ADDRESS NAME...', got {line.strip()!r}")
        for name in fields[1:]:
            if out.setdefault(name_key(name), fields[0]) != fields[0]:
                raise ConfigError(f"{source}:{lineno}: {name} has two addresses ({out[name_key(name)]}, {fields[0]})")
    return out


_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def name_key(name: str) -> str:
    """A host name as :func:`parse_hosts_file` keys it: ASCII letters in lower case (``strcasecmp``'s C locale)."""
    return name.translate(_LOWER)


def resolve_all(
    names: Sequence[str],
    *,
    method: str,
    host: Host,
    hosts_file: Path,
    node_addrs: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Resolve every tray to exactly one address; all must resolve, no two alike.

    ``dns``: the system resolver (NSS: /etc/hosts, DNS); the one IPv4 address
    that is not loopback, else an error (ambiguity would make trays disagree).
    ``hosts_file``: a static map, exactly as written, names matched without regard to case.
    ``slurm_conf``: ``node_addrs`` (:mod:`imexctl.slurm.nodeaddr`), each tray's
    ``NodeAddr``: an IPv4 address as written, refused when it is loopback or
    otherwise unusable; a name (or a tray without NodeAddr) resolved as ``dns``.

    Raises:
        ResolveError: naming each tray that failed and why.
    """
    table = _hosts_table(hosts_file) if method == "hosts_file" else None
    addresses: list[str] = []
    problems: list[str] = []
    for name in names:
        try:
            if table is not None:
                addresses.append(table[name_key(name)])
            elif method == "slurm_conf":
                addresses.append(_node_addr(host, name, (node_addrs or {}).get(name, name)))
            else:
                addresses.append(_dns_one(host, name))
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


#: how to fix this tray's address, by ``[resolve] method``
_OWN_FIX: Final = {
    "dns": "fix its DNS or /etc/hosts entry (DGX OS/Ubuntu map the host's own name to 127.0.1.1), "
    "or use [resolve] method = slurm_conf",
    "hosts_file": "fix its line in [paths] hosts_file",
    "slurm_conf": "fix its NodeAddr= in slurm.conf",
}


def check_own(node: str, address: str, method: str, host: Host) -> None:
    """Refuse this tray's address when it is on none of its interfaces: its daemon could not bind it.

    Checked before anything starts; otherwise the port check passes
    (``EADDRNOTAVAIL`` is no port in use) and the daemon fails to start.

    Raises:
        ResolveError: with the fix for ``method``.
    """
    try:
        local = host.is_local_address(address)
    except CommandError as exc:
        raise ResolveError(f"this tray {node}: cannot check its address {address}: {exc}") from exc
    if not local:
        raise ResolveError(
            f"this tray {node} resolves to {address} ([resolve] method = {method}), which is on none of its "
            f"interfaces: {_OWN_FIX.get(method, 'fix its address')}"
        )


def _node_addr(host: Host, name: str, addr: str) -> str:
    """A tray's slurm.conf ``NodeAddr``: an address as written (if a daemon can use it), or a name as ``dns``."""
    if not _is_ip(addr):
        return _dns_one(host, addr)
    if not _usable(addr):
        raise ResolveError(
            f"{name}: NodeAddr {addr} in slurm.conf is not a usable IPv4 address (loopback, 0.0.0.0, multicast, "
            "reserved or IPv6); set NodeAddr to the tray's address on the rack network"
        )
    return addr


def _dns_one(host: Host, name: str) -> str:
    try:
        found = host.resolve(name)
    except CommandError as exc:
        raise ResolveError(f"{name}: {exc.reason}") from exc
    usable = [a for a in found if _usable(a)]
    if len(usable) == 1:
        return usable[0]
    if not usable:
        hint = ""
        if any(a.startswith("127.") for a in found):
            hint = ("; DGX OS/Ubuntu images map the host's own name to 127.0.1.1 in /etc/hosts: "
                    "give it its rack address there, or use [resolve] method = slurm_conf")  # fmt: skip
        raise ResolveError(f"{name}: no non-loopback IPv4 address (0.0.0.0, multicast and reserved ones do not "
                           f"count; resolver gave {found or 'nothing'}){hint}")  # fmt: skip
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
