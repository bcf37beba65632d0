"""``imexctl topology blocks``: Slurm block configuration from the trays' own NVLink reports.

Input, one report per line: ``NODE KEY`` (``NODE -`` for a node without
multi-node NVLink fabric), or the one-line JSON that ``imexctl topology
--json`` prints, either behind a ``host: `` prefix as clush and pdsh add.
Output: one block per NVLink domain, as topology.conf lines (Slurm 23.11+,
topology.conf(5)), as topology.yaml (Slurm 25.05+, topology.yaml(5)), or as a
``NODE KEY`` map.  Block names come from the key, node lists are folded with
:mod:`imexctl.slurm.nodelist`, and everything is sorted, so the same reports give the
same bytes whatever their order; or from the site's own names (a map of
``NAME KEY`` or ``NAME NODES`` lines, or a pattern over the node names:
:func:`name_blocks`), so that a block reads ``r01`` rather than
``nvl-4f2a9c1e-7``.  BlockSizes rules (design.md source
slurm-topology, from SchedMD/slurm ``src/plugins/topology/block/block_record.c``):
each size a power-of-two multiple of the first, at most 2**15 times it; before
25.05 slurmctld refuses a block smaller than the base size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from imexctl.gpu.topology import NO_FABRIC, parse_key
from imexctl.platform import Record
from imexctl.platform.errors import NodeListError, ReportError
from imexctl.slurm import nodefold, nodelist
from imexctl.slurm.topofile import KEY_COMMENT, node_key_fields, short_name

__all__ = [
    "Block",
    "BlockNames",
    "Collected",
    "Report",
    "block_names",
    "collect",
    "fold_names",
    "group",
    "name_blocks",
    "natural",
    "parse_block_sizes",
    "parse_line",
    "parse_names",
    "parse_pattern",
    "render_conf",
    "render_map",
    "render_yaml",
    "size_warnings",
]

_MAX_LEVEL = 15  # block_record.c: a block level above 15 is an invalid BlockSizes value
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})


class Report(Record):
    """One node's answer: its key, or None with the reason (no fabric) or the error (NVML failed)."""

    node: str
    key: str | None
    reason: str
    error: str
    where: str


class Block(Record):
    """One NVLink domain: its block name, key and nodes (natural order)."""

    name: str
    key: str
    nodes: tuple[str, ...]


class Collected(Record):
    """Every node once: in a domain, without fabric, or without an answer."""

    keys: dict[str, str]
    no_fabric: dict[str, str]
    failed: dict[str, str]


def parse_line(text: str, where: str) -> Report | None:
    """One input line as a report; None for blank and ``#`` lines.

    Raises:
        ReportError: a line that is neither form, a bad node name or key, naming the node.
    """
    line = text.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    prefix = line[:brace].rstrip() if brace >= 0 else ""
    if brace >= 0 and (not prefix or (prefix.endswith(":") and " " not in prefix)):
        return _json_report(line[brace:], where)
    fields = node_key_fields(line)
    if len(fields) != 2:
        raise ReportError(f"{where}: malformed line (expected 'NODE KEY' or 'imexctl topology --json'): {line!r}")
    node = _node_name(fields[0], where)
    if fields[1] == "-":
        return Report(node, None, "reported as '-'", "", where)
    return Report(node, _key(fields[1], node, where), "", "", where)


def _json_report(text: str, where: str) -> Report:
    try:
        obj = json.loads(text)
        data = obj["data"]
        node, fabric = data["node"], data["fabric"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{where}: not an 'imexctl topology --json' object ({type(exc).__name__}: {exc})") from exc
    node = _node_name(str(node), where)
    if fabric == "nvlink":
        return Report(node, _key(str(data.get("key")), node, where), "", "", where)
    if fabric == "none":
        return Report(node, None, str(data.get("reason") or NO_FABRIC), "", where)
    if fabric == "error":
        return Report(node, None, "", str(data.get("error") or "error"), where)
    raise ReportError(f"{where}: node {node}: unknown fabric {fabric!r} (expected nvlink, none or error)")


def _node_name(name: str, where: str) -> str:
    try:
        nodefold.fold([name])
    except NodeListError as exc:
        raise ReportError(f"{where}: bad node name {name!r}: {exc.reason}") from exc
    return name


def _key(text: str, node: str, where: str) -> str:
    try:
        return parse_key(text)
    except ValueError as exc:
        raise ReportError(f"{where}: node {node}: bad NVLink domain key: {exc}") from exc


def collect(reports: Iterable[Report]) -> Collected:
    """Every node once; the same node twice with one answer is fine.

    Raises:
        ReportError: a node reported twice with different answers, naming both places; no report at all.
    """
    first: dict[str, Report] = {}
    for report in reports:
        seen = first.setdefault(report.node, report)
        if (seen.key, bool(seen.error)) != (report.key, bool(report.error)):
            raise ReportError(
                f"{report.where}: node {report.node} reported twice with different keys: "
                f"{_answer(seen)} ({seen.where}) and {_answer(report)} ({report.where})"
            )
    if not first:
        raise ReportError("no reports in the input (expected 'NODE KEY' lines or 'imexctl topology --json' output)")
    return Collected(
        keys={n: r.key for n, r in first.items() if r.key},
        no_fabric={n: r.reason for n, r in first.items() if not r.key and not r.error},
        failed={n: r.error for n, r in first.items() if r.error},
    )


def _answer(report: Report) -> str:
    return report.key or ("no answer" if report.error else "no fabric")


def natural(name: str) -> tuple[tuple[tuple[bool, Any], ...], str]:
    """Sort key: runs of ASCII digits compare as numbers (``gb9`` before ``gb10``)."""
    from itertools import groupby

    runs = ("".join(run) for _, run in groupby(name, key=lambda c: c in "0123456789"))
    return tuple((r[0] in "0123456789", int(r) if r[0] in "0123456789" else r) for r in runs), name


def block_names(keys: Iterable[str]) -> dict[str, str]:
    """Key -> block name: ``nvl-<first 8 hex of the UUID>-<cliqueId>``, the whole UUID where two would clash."""
    keys = set(keys)
    short = {k: short_name(k) for k in keys}
    clashes = {name for name in short.values() if list(short.values()).count(name) > 1}
    return {
        k: (f"nvl-{k.partition('.')[0].replace('-', '')}-{k.rpartition('.')[2]}" if short[k] in clashes else short[k])
        for k in keys
    }


def group(collected: Collected) -> list[Block]:
    """One block per key, nodes in natural order, blocks ordered by their first node."""
    members: dict[str, list[str]] = {}
    for node, key in collected.keys.items():
        members.setdefault(key, []).append(node)
    names = block_names(members)
    blocks = [Block(names[k], k, tuple(sorted(nodes, key=natural))) for k, nodes in members.items()]
    return sorted(blocks, key=lambda b: natural(b.nodes[0]))


def parse_block_sizes(text: str) -> tuple[int, ...]:
    """``--block-sizes 18,36``: positive, increasing, each a power-of-two multiple (up to 2**15) of the first.

    Raises:
        ValueError: saying which value breaks which rule.
    """
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None
    base = sizes[0]
    for prior, size in zip((0, *sizes), sizes):
        level = size // base if base > 0 else 0
        if size <= prior or size % base or level & (level - 1) or level > 1 << _MAX_LEVEL:
            raise ValueError(
                f"{size}: block sizes must be increasing, each a power-of-two multiple of the first "
                f"({base}) and at most {1 << _MAX_LEVEL} times it"
            )
    return sizes


def size_warnings(blocks: Sequence[Block], sizes: Sequence[int]) -> list[str]:
    """No block at all, or blocks smaller than the base block size (fatal for slurmctld before 25.05)."""
    if not blocks:
        return ["no node reported a multi-node NVLink fabric: the output has no block, which slurmctld refuses"]
    base = sizes[0] if sizes else len(blocks[0].nodes)
    what = "the first BlockSizes value" if sizes else f"the first block ({blocks[0].name})"
    return [
        f"block {b.name} has {len(b.nodes)} node(s), fewer than {what}, {base}: "
        f"Slurm 25.05 and later accept this, slurmctld before 25.05 refuses to start"
        for b in blocks
        if len(b.nodes) < base
    ]


def _others(collected: Collected) -> list[str]:
    """Comment lines for the nodes in no block."""
    lines = []
    if collected.no_fabric:
        lines.append(f"# {NO_FABRIC} (in no block): {fold_names(collected.no_fabric)}")
    if collected.failed:
        lines.append(f"# no answer (NVML failed; in no block): {fold_names(collected.failed)}")
    return lines


def fold_names(nodes: Iterable[str]) -> str:
    """The names in natural order, folded into one host list."""
    return nodefold.fold(sorted(nodes, key=natural))


def _summary(blocks: Sequence[Block]) -> str:
    nodes = sum(len(b.nodes) for b in blocks)
    return f"# {len(blocks)} NVLink domain(s), {nodes} node(s); generated by imexctl topology blocks"


def render_conf(blocks: Sequence[Block], collected: Collected, sizes: Sequence[int] = ()) -> str:
    """topology.conf lines for ``TopologyPlugin=topology/block``, each block with its key as a comment."""
    lines = [_summary(blocks)]
    lines += [f"BlockName={b.name} Nodes={fold_names(b.nodes)}  # {KEY_COMMENT} {b.key}" for b in blocks]
    if sizes:
        lines.append("BlockSizes=" + ",".join(str(s) for s in sizes))
    return "\n".join(lines + _others(collected)) + "\n"


def render_yaml(blocks: Sequence[Block], collected: Collected, sizes: Sequence[int] = (), name: str = "nvlink") -> str:
    """topology.yaml (Slurm 25.05+) with one block topology, the cluster default."""
    lines = [_summary(blocks), f"- topology: {_yaml(name)}", "  cluster_default: true", "  block:"]
    if sizes:
        lines.append("    block_sizes: [" + ", ".join(str(s) for s in sizes) + "]")
    lines.append("    blocks:")
    for b in blocks:
        lines += [
            f"      - block: {_yaml(b.name)}  # {KEY_COMMENT} {b.key}",
            f"        nodes: {_yaml(fold_names(b.nodes))}",
        ]
    return "\n".join(lines + _others(collected)) + "\n"


def _yaml(text: str) -> str:
    """A plain scalar where YAML reads it as that string, else a double-quoted one (JSON's escapes)."""
    plain = (text[:1].isalpha() or text[:1] == "_") and all(c.isalnum() or c in "_.-[]," for c in text)
    if plain and text.isascii() and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)


def render_map(collected: Collected) -> str:
    """``NODE KEY`` lines in natural node order, for ``[topology] source = map`` or ``[paths] topology_map``."""
    lines = ["# NODE KEY: each tray's NVLink domain; generated by imexctl topology blocks --map"]
    lines += [f"{node} {collected.keys[node]}" for node in sorted(collected.keys, key=natural)]
    return "\n".join(lines + _others(collected)) + "\n"


# ---------------------------------------------------------------- the site's block names

#: a block name the site gives: a word Slurm, YAML and a Prometheus label value take as it is
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class BlockNames(Record):
    """The site's names for blocks: by NVML key, by node (a ``--names`` map), and a pattern over node names."""

    by_key: Mapping[str, str]
    by_node: Mapping[str, str]
    source: str = ""
    pattern: re.Pattern[str] | None = None


def _site_name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise ReportError(
            f"{where}: block name {name!r} is not a word of letters, digits, '_', '.' and '-' (64 at most, "
            "not starting with '.' or '-')"
        )
    return name


def parse_names(text: str, source: str) -> BlockNames:
    """A ``--names`` map: ``NAME KEY`` (one NVLink domain) or ``NAME NODES`` (a host list of its trays) lines.

    ``#`` comments and blank lines are skipped; a name may have several lines.

    Raises:
        ReportError: a line that is not two fields, a bad name or host list, a key or a node given two names.
    """
    by_key: dict[str, str] = {}
    by_node: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source}:{lineno}"
        if len(fields) != 2:
            raise ReportError(f"{where}: expected 'NAME KEY' or 'NAME NODES', got {raw.strip()!r}")
        name = _site_name(fields[0], where)
        try:
            key: str | None = parse_key(fields[1])
        except ValueError:
            key = None
        if key is not None:
            if by_key.setdefault(key, name) != name:
                raise ReportError(f"{where}: key {key} is named both {by_key[key]} and {name}")
            continue
        try:
            nodes = nodelist.expand(fields[1])
        except NodeListError as exc:
            raise ReportError(f"{where}: {fields[1]!r} is neither an NVLink domain key nor a host list: {exc}") from exc
        for node in nodes:
            if by_node.setdefault(node, name) != name:
                raise ReportError(f"{where}: node {node} is named both {by_node[node]} and {name}")
    return BlockNames(by_key, by_node, source)


def parse_pattern(text: str) -> re.Pattern[str]:
    """A ``--name-pattern``: a regular expression over a whole node name whose one group is the block's name.

    Raises:
        ValueError: not a regular expression, or not exactly one group.
    """
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"{text!r} is not a regular expression: {exc}") from None
    if pattern.groups != 1:
        raise ValueError(f"{text!r} must have exactly one group, the block's name (it has {pattern.groups})")
    return pattern


def name_blocks(found: Sequence[Block], names: BlockNames) -> list[Block]:
    """The blocks with the site's names: the map's name for the key or the nodes, else the pattern's, else as made.

    Every node of a block must agree: a block whose trays the map names
    differently (a tray cabled into another rack than the inventory says), or
    whose nodes the pattern names differently or not at all, is refused; so is
    one name for two blocks.

    Raises:
        ReportError: naming the block, its nodes and the names.
    """
    out: list[Block] = []
    for block in found:
        name = names.by_key.get(block.key) or _name_by_nodes(block, names)
        out.append(block._replace(name=name) if name else block)
    seen: dict[str, Block] = {}
    for block in out:
        other = seen.setdefault(block.name, block)
        if other is not block:
            raise ReportError(
                f"blocks {other.key} ({fold_names(other.nodes)}) and {block.key} ({fold_names(block.nodes)}) "
                f"would both be named {block.name}: they are two NVLink domains"
            )
    return out


def _name_by_nodes(block: Block, names: BlockNames) -> str:
    mapped = {names.by_node[n] for n in block.nodes if n in names.by_node}
    if len(mapped) > 1:
        raise ReportError(
            f"block {block.key} ({fold_names(block.nodes)}) is one NVLink domain, but {names.source} names its "
            f"trays {', '.join(sorted(mapped))}: "
            + "; ".join(
                f"{fold_names(n for n in block.nodes if names.by_node.get(n) == m)} as {m}" for m in sorted(mapped)
            )
        )
    if mapped:
        return mapped.pop()
    if names.pattern is None:
        return ""
    pattern, got = names.pattern, {}
    for node in block.nodes:
        match = pattern.fullmatch(node)
        got[node] = match.group(1) if match and match.group(1) else ""
    values = set(got.values())
    if len(values) != 1 or "" in values:
        unmatched = [n for n, v in got.items() if not v]
        detail = (
            f"{fold_names(unmatched)} do not match it" if unmatched else f"its trays give {', '.join(sorted(values))}"
        )
        raise ReportError(
            f"block {block.key} ({fold_names(block.nodes)}): --name-pattern {pattern.pattern!r}: {detail}"
        )
    return _site_name(values.pop(), f"block {block.key}: --name-pattern {pattern.pattern!r}")
