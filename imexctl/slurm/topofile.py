"""The prolog's NVLink-domain sources: Slurm topology.conf and topology.yaml blocks, and NODE KEY maps.

Each source becomes a :class:`BlockMap`: which block (NVLink domain) every
node is in, and, where the source says, the domain's NVML key.  topology.conf
and topology.yaml carry a key as a comment ``# imexctl-key: <key>`` on the
block's line (``imexctl topology blocks`` writes it); a map gives every node
its key.  Syntax: Slurm's topology.conf(5) and topology.yaml(5) (Slurm 25.05+;
design.md source slurm-topology).

topology.yaml is read by a strict reader of the YAML that such files use
(block mappings and sequences, one-line scalars, ``[a, b]`` lists, comments);
anything else (anchors, tags, flow mappings, multi-line scalars) is refused
with the line, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imexctl.platform import Record
from imexctl.platform.errors import ConfigError, NodeListError
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.slurm import nodelist

__all__ = [
    "KEY_COMMENT",
    "MAP_UNIT",
    "BlockMap",
    "load",
    "node_key_fields",
    "parse_map",
    "parse_topology",
    "parse_yaml",
    "short_name",
]

KEY_COMMENT = "imexctl-key:"
#: what names a node's domain in a NODE KEY map (its blocks are keys)
MAP_UNIT = "map line"


#: hex digits of the cluster UUID in a block name made from a key
_SHORT_UUID = 8


def short_name(key: str) -> str:
    """The block name made from an NVLink domain key: ``nvl-<first 8 hex of the UUID>-<cliqueId>``."""
    return f"nvl-{key[:_SHORT_UUID]}-{key.rpartition('.')[2]}"


class BlockMap(Record):
    """Node -> block, and block -> NVML key where the source gives one."""

    source: str
    block_of: Mapping[str, str]
    keys: Mapping[str, str]
    #: what names a node's domain in this format, for messages: "BlockName= block", "map line"...
    unit: str = "block"

    def key_of(self, node: str) -> str | None:
        """The key the source gives ``node``'s block, or None."""
        block = self.block_of.get(node)
        return None if block is None else self.keys.get(block)


def load(kind: str, path: Path, yaml_topology: str = "") -> BlockMap:
    """Read and parse one source file (``topology_conf``, ``topology_yaml`` or ``map``).

    Raises:
        ConfigError: unreadable (or a symlink), or malformed; naming file and line.
    """
    try:
        text = read_text_nofollow(path, trusted=True)
    except OSError as exc:
        raise ConfigError(f"cannot read topology file {path}: {exc.strerror}") from exc
    if kind == "topology_yaml":
        return parse_yaml(text, str(path), yaml_topology)
    if kind == "map":
        return parse_map(text, str(path))
    return parse_topology(text, str(path))


# ---------------------------------------------------------------- shared


class _Builder:
    """Collects node -> block and block -> key, refusing a node in two blocks."""

    def __init__(self, source: str, unit: str) -> None:
        self.source, self.unit = source, unit
        self.block_of: dict[str, str] = {}
        self.keys: dict[str, str] = {}

    def add(self, where: str, block: str, names: list[str], key: str | None) -> None:
        for name in names:
            if self.block_of.setdefault(name, block) != block:
                raise ConfigError(f"{where}: node {name} is in blocks {self.block_of[name]} and {block}")
        if key is not None and self.keys.setdefault(block, key) != key:
            raise ConfigError(f"{where}: block {block} has two keys, {self.keys[block]} and {key}")

    def done(self) -> BlockMap:
        return BlockMap(self.source, self.block_of, self.keys, self.unit)


def _expand(nodes: str, where: str) -> list[str]:
    try:
        return nodelist.expand(nodes)
    except NodeListError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _comment_key(comment: str, where: str) -> str | None:
    """The key of an ``imexctl-key: <key>`` comment, None without one."""
    from imexctl.gpu.topology import parse_key

    if KEY_COMMENT not in comment:
        return None
    words = comment.split(KEY_COMMENT, 1)[1].split()
    try:
        return parse_key(words[0] if words else "")
    except ValueError as exc:
        raise ConfigError(f"{where}: bad {KEY_COMMENT} comment: {exc}") from exc


# ---------------------------------------------------------------- topology.conf


def parse_topology(text: str, source: str) -> BlockMap:
    """``BlockName=<b> Nodes=<hostlist>`` lines (names case-insensitive, as in Slurm).

    Other lines (``BlockSizes=``, ``SwitchName=``), blank lines and ``#``
    comments are ignored; an ``imexctl-key:`` comment on a block line gives
    the block's key.

    Raises:
        ConfigError: a block line without a name or nodes, a bad host list,
            a node in two blocks, a block with two keys, a bad key comment.
    """
    built = _Builder(source, "BlockName= block")
    for lineno, raw in enumerate(text.splitlines(), 1):
        line, _, comment = raw.partition("#")
        line = line.strip()
        if not line.lower().startswith("blockname="):
            continue
        where = f"{source}:{lineno}"
        fields = {k.lower(): v for k, _, v in (f.partition("=") for f in line.split())}
        block, nodes = fields.get("blockname", ""), fields.get("nodes", "")
        if not block or not nodes:
            raise ConfigError(f"{where}: block line needs BlockName= and Nodes=: {line!r}")
        built.add(where, block, _expand(nodes, where), _comment_key(comment, where))
    return built.done()


# ---------------------------------------------------------------- NODE KEY map


def node_key_fields(line: str) -> list[str]:
    """The fields of one ``NODE KEY`` line, without its ``#`` comment and a ``host: `` prefix.

    clush and pdsh put ``host: `` before each line a node printed, so a map
    collected with them (``clush -w ... 'echo $(hostname -s) KEY'``) reads
    ``host: NODE KEY``: the prefix is dropped and the node is the line's own,
    as ``topology blocks`` does for a JSON report behind the prefix.
    """
    fields = line.split("#", 1)[0].split()
    if len(fields) == 3 and fields[0].endswith(":") and len(fields[0]) > 1:
        return fields[1:]
    return fields


def parse_map(text: str, source: str) -> BlockMap:
    """``NODE KEY`` lines (``imexctl topology blocks --map``); ``#`` comments and blank lines skipped.

    ``NODE -`` says the node has no multi-node NVLink fabric: it is in no domain.
    A line may carry the ``host: `` prefix of clush and pdsh (:func:`node_key_fields`).

    Raises:
        ConfigError: a line that is not ``NODE KEY``, a bad key, a node given twice.
    """
    from imexctl.gpu.topology import parse_key

    built, seen = _Builder(source, MAP_UNIT), set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = node_key_fields(raw)
        if not fields:
            continue
        where = f"{source}:{lineno}"
        if len(fields) != 2 or _expand(fields[0], where) != [fields[0]]:
            raise ConfigError(f"{where}: expected 'NODE KEY', got {raw.strip()!r}")
        node, key = fields
        if node in seen:
            raise ConfigError(f"{where}: node {node} is listed twice")
        seen.add(node)
        if key == "-":
            continue
        try:
            key = parse_key(key)
        except ValueError as exc:
            raise ConfigError(f"{where}: node {node}: {exc}") from exc
        built.add(where, key, [node], key)
    return built.done()


# ---------------------------------------------------------------- topology.yaml


def parse_yaml(text: str, source: str, topology: str = "") -> BlockMap:
    """The blocks of one ``block`` topology of a topology.yaml.

    Args:
        text: the file.
        source: its name, for messages.
        topology: the ``topology:`` name to read; empty: the file's only block topology.

    Raises:
        ConfigError: YAML this reader does not take, no such (or no single)
            block topology, a block without a name, nodes that are not one
            host list, a node in two blocks, a bad key comment.
    """
    tokens = _tokens(text, source)
    doc, end = _node(tokens, 0, -1, source)
    if end != len(tokens):
        raise ConfigError(f"{source}:{tokens[end].line}: unexpected indentation")
    chosen = _choose_topology(doc, source, topology)
    built = _Builder(source, "block of the topology")
    comments = {t.line: t.comment for t in tokens if t.key == "block"}
    for name, nodes, line in _blocks_of(chosen, source):
        where = f"{source}:{line}"
        built.add(where, name, _expand(nodes, where), _comment_key(comments.get(line, ""), where))
    return built.done()


class _Entry(Record):
    """A mapping's value and the line of its key."""

    value: Any
    line: int


class _Token(Record):
    """One piece of a line: a ``-`` sequence marker, a ``key: value`` or ``key:``, or a scalar."""

    line: int
    col: int
    dash: bool
    key: str | None
    value: str
    comment: str


def _tokens(text: str, source: str) -> list[_Token]:
    out: list[_Token] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        content, comment = _strip_comment(raw, f"{source}:{lineno}")
        stripped = content.strip()
        if not stripped or (stripped in ("---", "...") and not content.startswith(" ")):
            continue
        indent = len(content) - len(content.lstrip(" "))
        if content[indent] == "\t":
            raise ConfigError(f"{source}:{lineno}: a tab in the indentation (YAML allows spaces only)")
        col, rest = indent, content[indent:].rstrip()
        while rest == "-" or rest.startswith("- "):
            out.append(_Token(lineno, col, True, None, "", comment))
            after = rest[1:].lstrip(" ")
            col, rest = col + len(rest) - len(after), after
        if rest:
            out.append(_split_key(lineno, col, rest, comment))
    return out


def _strip_comment(raw: str, where: str) -> tuple[str, str]:
    """The line without its comment, and the comment; quotes are respected."""
    quote = ""
    for index, char in enumerate(raw):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"" and (index == 0 or raw[index - 1] in " [,-:"):
            quote = char
        elif char == "#" and (index == 0 or raw[index - 1] in " \t"):
            return raw[:index], raw[index + 1 :]
    if quote:
        raise ConfigError(f"{where}: unterminated quoted string")
    return raw, ""


def _split_key(lineno: int, col: int, rest: str, comment: str) -> _Token:
    head, sep, value = rest.partition(":")
    if sep and (not value or value[0] == " ") and head.replace("_", "a").replace("-", "a").isalnum():
        return _Token(lineno, col, False, head, value.strip(), comment)
    return _Token(lineno, col, False, None, rest, comment)


def _node(tokens: list[_Token], i: int, parent: int, source: str) -> tuple[Any, int]:
    """The value that starts at ``tokens[i]`` if it is deeper than ``parent``; else None."""
    if i >= len(tokens) or tokens[i].col <= parent:
        return None, i
    token = tokens[i]
    if token.dash:
        return _sequence(tokens, i, source)
    if token.key is not None:
        return _mapping(tokens, i, source)
    return _scalar(token.value, f"{source}:{token.line}"), i + 1


def _sequence(tokens: list[_Token], i: int, source: str) -> tuple[list[Any], int]:
    col, items = tokens[i].col, []
    while i < len(tokens) and tokens[i].col == col and tokens[i].dash:
        item, i = _node(tokens, i + 1, col, source)
        items.append(item)
    return items, i


def _mapping(tokens: list[_Token], i: int, source: str) -> tuple[dict[str, _Entry], int]:
    col, out = tokens[i].col, {}
    while i < len(tokens) and tokens[i].col == col and tokens[i].key is not None:
        token, key = tokens[i], str(tokens[i].key)
        if key in out:
            raise ConfigError(f"{source}:{token.line}: key {key!r} given twice")
        i += 1
        if token.value:
            out[key] = _Entry(_scalar(token.value, f"{source}:{token.line}"), token.line)
            continue
        nested = i < len(tokens) and tokens[i].col == col and tokens[i].dash  # "key:" then "- item" at its column
        value, i = _sequence(tokens, i, source) if nested else _node(tokens, i, col, source)
        out[key] = _Entry(value, token.line)
    if i < len(tokens) and tokens[i].col >= col:
        raise ConfigError(f"{source}:{tokens[i].line}: expected 'key: value' at this indentation")
    return out, i


def _scalar(text: str, where: str) -> Any:
    """A one-line scalar (plain, quoted) or a ``[a, b]`` list of them."""
    if not text:
        raise ConfigError(f"{where}: empty value in a list")
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(part.strip(), where) for part in inner.split(",")] if inner else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        inner = text[1:-1]
        if text[0] == '"' and ("\\" in inner or '"' in inner):
            raise ConfigError(f"{where}: escapes in double-quoted strings are not supported: {text}")
        return inner.replace("''", "'") if text[0] == "'" else inner
    if text[0] in "[]{}&*!|>%@`'\"?" or ": " in text or text.endswith(":"):
        raise ConfigError(f"{where}: YAML that imexctl does not read (only plain or quoted one-line values): {text}")
    return text


def _value(mapping: dict[str, _Entry], key: str) -> Any:
    entry = mapping.get(key)
    return None if entry is None else entry.value


def _choose_topology(doc: Any, source: str, wanted: str) -> dict[str, _Entry]:
    if not isinstance(doc, list) or not doc or not all(isinstance(t, dict) for t in doc):
        raise ConfigError(f"{source}: expected a list of topologies ('- topology: NAME' entries)")
    named: dict[str, dict[str, _Entry]] = {}
    for entry in doc:
        name = _value(entry, "topology")
        if not isinstance(name, str) or name in named:
            raise ConfigError(f"{source}: every topology needs its own 'topology: NAME' (got {name!r})")
        named[name] = entry
    blocks = [name for name, t in named.items() if "block" in t]
    if wanted:
        if wanted not in blocks:
            what = "is not a block topology" if wanted in named else f"is not there (topologies: {', '.join(named)})"
            raise ConfigError(f"{source}: topology {wanted!r} {what}")
        return named[wanted]
    if len(blocks) != 1:
        found = ", ".join(blocks) or "none"
        raise ConfigError(f"{source}: set [topology] yaml_topology: {len(blocks)} block topologies ({found})")
    return named[blocks[0]]


def _blocks_of(topology: dict[str, _Entry], source: str) -> list[tuple[str, str, int]]:
    """``(name, nodes, line)`` of every entry of ``block: blocks:``."""
    block = topology["block"]
    blocks = _value(block.value, "blocks") if isinstance(block.value, dict) else None
    if not isinstance(blocks, list):
        raise ConfigError(f"{source}:{block.line}: the block topology has no 'blocks:' list")
    out = []
    for entry in blocks:
        if not isinstance(entry, dict) or "block" not in entry:
            raise ConfigError(f"{source}:{block.line}: every entry of 'blocks:' needs 'block: NAME'")
        name, nodes, line = _value(entry, "block"), _value(entry, "nodes") or "", entry["block"].line
        if not isinstance(name, str) or not name or not isinstance(nodes, str):
            raise ConfigError(f"{source}:{line}: 'block' and 'nodes' must be one name and one host list")
        out.append((name, nodes, line))
    return out
