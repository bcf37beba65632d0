"""Parse what ``nvidia-imex-ctl`` prints: ``-q`` states and ``-N`` domain status.

Pure functions over strings (house rule 1): nothing here runs a process.
Formats follow design.md source ctl-n-json; spellings that are not
confirmed (design.md source ctl-spellings) are kept verbatim, so callers compare against ``READY``,
``CONNECTED`` and ``UP`` only and log anything else as it came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from imexctl.platform import Record
from imexctl.platform.errors import OutputError

__all__ = [
    "CONNECTION_LETTERS",
    "NOT_READY_STATES",
    "QUERY_STATES",
    "Connection",
    "DomainStatus",
    "NodeStatus",
    "format_domain_table",
    "is_not_configured",
    "parse_domain_json",
    "parse_query",
]

#: The eight ``-q`` states, in DCGM's enum order (design.md source ctl-q-states).
QUERY_STATES: Final = (
    "INITIALIZING",
    "STARTING_AUTH_SERVER",
    "WAITING_FOR_PEERS",
    "WAITING_FOR_RECOVERY",
    "INIT_GPU",
    "READY",
    "SHUTTING_DOWN",
    "UNAVAILABLE",
)

#: Connectivity-table letter (``-N`` text) -> connection status (``-N -j`` spelling).
CONNECTION_LETTERS: Final[Mapping[str, str]] = {
    "C": "CONNECTED",
    "I": "INVALID",
    "N": "NEVER_CONNECTED",
    "R": "RECOVERING",
    "D": "DISCONNECTED",
    "A": "AUTHENTICATING",
    "!V!": "VERSION_MISMATCH",
    "!M!": "NODE_MAP_MISMATCH",
}

#: ``-q`` states of a daemon that is alive and says it is not ready (yet); UNAVAILABLE is not
#: among them: it means "not reachable", which may be the asking side's network.
NOT_READY_STATES: Final = frozenset(
    {"INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY", "INIT_GPU", "SHUTTING_DOWN"}
)

_NOT_CONFIGURED: Final = "Failed to read node configuration file"


def is_not_configured(output: str) -> bool:
    """Whether ctl output says the node configuration cannot be read (a fatal misconfiguration)."""
    return _NOT_CONFIGURED in output


_SHOWN_CHARS: Final = 200
_MAX_FIELD: Final = 256


def _shown(text: str) -> str:
    """Return ``text`` quoted and cut short enough for an error message."""
    if len(text) > _SHOWN_CHARS:
        return repr(text[:_SHOWN_CHARS]) + "..."
    return repr(text)


class Connection(Record):
    """One cell of the connectivity table: how ``node`` sees ``peer_id``."""

    peer_id: int
    host: str
    status: str

    @property
    def is_connected(self) -> bool:
        """Whether the link is ``CONNECTED``."""
        return self.status == "CONNECTED"


class NodeStatus(Record):
    """One line of the nodes file as the queried daemon reports it."""

    node_id: int
    host: str
    status: str
    version: str
    hostname: str
    connections: tuple[Connection, ...]

    @property
    def is_ready(self) -> bool:
        """Whether the node reports ``READY``."""
        return self.status == "READY"

    def connection_to(self, peer_id: int) -> Connection | None:
        """Return this node's connection to ``peer_id``, if listed."""
        for conn in self.connections:
            if conn.peer_id == peer_id:
                return conn
        return None

    def peer_connections(self) -> tuple[Connection, ...]:
        """Return the connections to other nodes (the self entry left out, design.md source ctl-spellings)."""
        return tuple(c for c in self.connections if c.peer_id != self.node_id)


class DomainStatus(Record):
    """The whole ``-N`` answer: domain state, timestamp and one entry per node."""

    status: str
    timestamp: str
    nodes: tuple[NodeStatus, ...]

    @property
    def is_up(self) -> bool:
        """Whether the domain state is ``UP``."""
        return self.status == "UP"

    def node(self, node_id: int) -> NodeStatus | None:
        """Return the node with this ID, if present."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        return None

    def node_by_host(self, addr: str) -> NodeStatus | None:
        """Return the node whose ``host`` (or, failing that, ``hostname``) is ``addr``."""
        for node in self.nodes:
            if node.host == addr:
                return node
        for node in self.nodes:
            if addr and node.hostname == addr:
                return node
        return None

    def node_map(self) -> tuple[str, ...]:
        """The nodes' addresses in node-ID order: the nodes file as the ctl saw it.

        Node IDs are line numbers: if they are not exactly 0..n-1, every entry is
        ``"<id>: <address>"``, which no nodes file matches.
        """
        nodes = sorted(self.nodes, key=lambda n: n.node_id)
        if [n.node_id for n in nodes] != list(range(len(nodes))):
            return tuple(f"{n.node_id}: {n.host}" for n in nodes)
        return tuple(n.host for n in nodes)

    def mismatches(self) -> list[tuple[int, int, str]]:
        """Links with a node-map or version mismatch (communication disabled: waiting cannot fix them)."""
        return [(a, b, st) for a, b, st in self.not_connected() if st in ("NODE_MAP_MISMATCH", "VERSION_MISMATCH")]

    def not_ready_peers(self) -> tuple[str, ...]:
        """Hosts of nodes that answer and say they are not ready (:data:`NOT_READY_STATES`)."""
        return tuple(n.host for n in self.nodes if n.status in NOT_READY_STATES)

    def silent_peers(self, me: str) -> tuple[tuple[str, str], ...]:
        """``(host, what)`` of each peer of ``me`` that is not ready or not connected to it, in node order.

        ``what`` says whether its command service answered the ctl on this tray
        (``command service unreachable`` for an UNAVAILABLE node, else its status)
        and how ``me``'s daemon sees its link to it.
        """
        mine = self.node_by_host(me)
        out = []
        for node in self.nodes:
            if mine is not None and node.node_id == mine.node_id:
                continue
            link = mine.connection_to(node.node_id) if mine is not None else None
            if node.is_ready and link is not None and link.is_connected:
                continue
            said = (
                "command service unreachable" if node.status == "UNAVAILABLE" else f"command service says {node.status}"
            )
            out.append((node.host, said + (f", link from here {link.status}" if link is not None else "")))
        return tuple(out)

    def unreachable_but_connected(self) -> tuple[str, ...]:
        """Hosts shown UNAVAILABLE although a reachable node reports a CONNECTED link to them.

        ``nvidia-imex-ctl -N`` asks every node's command service itself; a node
        it cannot reach is UNAVAILABLE with every link INVALID, while the other
        nodes' rows still show their own links to it.  A CONNECTED link to such a
        node means its daemon is up and only its command port is blocked between
        the asking tray and it (a firewall, or a loopback-only bind).
        """
        live = [n for n in self.nodes if n.status != "UNAVAILABLE"]
        return tuple(
            n.host
            for n in self.nodes
            if n.status == "UNAVAILABLE" and any((c := o.connection_to(n.node_id)) and c.is_connected for o in live)
        )

    def not_connected(self, *, include_self: bool = False) -> list[tuple[int, int, str]]:
        """Return ``(from_id, to_id, status)`` for every link that is not ``CONNECTED``.

        Args:
            include_self: also report a node's entry for itself (the table's
                diagonal); left out by default, as design.md source ctl-spellings advises.
        """
        out = []
        for node in self.nodes:
            for conn in node.connections:
                if conn.peer_id == node.node_id and not include_self:
                    continue
                if not conn.is_connected:
                    out.append((node.node_id, conn.peer_id, conn.status))
        return out


def parse_query(output: str) -> str:
    """Return the daemon state printed by ``nvidia-imex-ctl -q``.

    Args:
        output: stdout (or stdout+stderr) of the command.

    Returns:
        One of :data:`QUERY_STATES`, exactly as printed.

    Raises:
        OutputError: the output says the node configuration could not be
            read, or is not exactly one known state word.
    """
    if _NOT_CONFIGURED in output:
        line = next(ln for ln in output.splitlines() if _NOT_CONFIGURED in ln)
        raise OutputError(f"nvidia-imex-ctl -q: not configured: {line.strip()!r}")
    word = output.strip()
    if not word:
        raise OutputError("nvidia-imex-ctl -q: empty output, expected one state word")
    if word not in QUERY_STATES:
        raise OutputError(f"nvidia-imex-ctl -q: unknown state {_shown(word)}")
    return word


# ---------------------------------------------------------------- -N -j


def _want(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """Return ``obj[key]`` checked to be a ``kind``, else raise naming ``where``."""
    if key not in obj:
        raise OutputError(f"nvidia-imex-ctl -N -j: {where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise OutputError(
            f"nvidia-imex-ctl -N -j: {where}: {key!r} is {type(value).__name__}, expected {kind.__name__}"
        )
    # states, addresses, host names and versions are short; a longer one would flood every message quoting it
    if isinstance(value, str) and len(value) > _MAX_FIELD:
        raise OutputError(f"nvidia-imex-ctl -N -j: {where}: {key!r} is {len(value)} characters long: {_shown(value)}")
    return value


def _optional_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    """Return ``obj[key]`` if it is a string, ``""`` if absent, else raise."""
    if key not in obj:
        return ""
    return str(_want(obj, key, str, where))


def _node_id(key: str, where: str) -> int:
    """Turn a JSON object key such as ``"17"`` into a node ID."""
    # node IDs are line numbers of the nodes file; int() of thousands of digits raises ValueError
    if not (key.isascii() and key.isdigit() and len(key) <= 9):
        raise OutputError(f"nvidia-imex-ctl -N -j: {where}: node ID {_shown(key)} is not a number below 10**9")
    return int(key)


def _json_connections(raw: Mapping[str, Any], where: str) -> tuple[Connection, ...]:
    """Build the connections of one node from its ``connections`` object."""
    conns = []
    for key, value in raw.items():
        cwhere = f"{where}.connections[{_shown(key)}]"
        peer = _node_id(key, cwhere)
        if not isinstance(value, dict):
            raise OutputError(f"nvidia-imex-ctl -N -j: {cwhere} is {type(value).__name__}, expected object")
        status = _want(value, "status", str, cwhere)
        conns.append(Connection(peer, _optional_str(value, "host", cwhere), status))
    return tuple(sorted(conns, key=lambda c: c.peer_id))


def _json_node(key: str, raw: Any) -> NodeStatus:
    """Build one :class:`NodeStatus` from ``nodes[key]``."""
    where = f"nodes[{_shown(key)}]"
    node_id = _node_id(key, where)
    if not isinstance(raw, dict):
        raise OutputError(f"nvidia-imex-ctl -N -j: {where} is {type(raw).__name__}, expected object")
    conns = raw.get("connections", {})
    if not isinstance(conns, dict):
        raise OutputError(f"nvidia-imex-ctl -N -j: {where}.connections is {type(conns).__name__}, expected object")
    return NodeStatus(
        node_id=node_id,
        host=_want(raw, "host", str, where),
        status=_want(raw, "status", str, where),
        version=_optional_str(raw, "version", where),
        hostname=_optional_str(raw, "hostName", where),
        connections=_json_connections(conns, where),
    )


def parse_domain_json(text: str) -> DomainStatus:
    """Parse ``nvidia-imex-ctl -N -j`` output (design.md source ctl-n-json).

    Required: top-level ``status`` and ``nodes``; per node ``status`` and
    ``host``; per connection ``status``.  ``timestamp``, ``version``,
    ``hostName`` and a connection's ``host`` default to ``""``.  Unknown
    keys are ignored and status spellings are kept verbatim.

    Raises:
        OutputError: not JSON, not an object, or a required key is missing
            or has the wrong type; the message names the offending key.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OutputError(f"nvidia-imex-ctl -N -j: not JSON ({exc}): {_shown(text)}") from exc
    except RecursionError as exc:  # json.loads recurses once per nesting level
        raise OutputError(f"nvidia-imex-ctl -N -j: nested too deeply to parse: {_shown(text)}") from exc
    if not isinstance(data, dict):
        raise OutputError(f"nvidia-imex-ctl -N -j: top level is {type(data).__name__}, expected object")
    status = _want(data, "status", str, "top level")
    nodes_raw = _want(data, "nodes", dict, "top level")
    nodes = sorted((_json_node(k, v) for k, v in nodes_raw.items()), key=lambda n: n.node_id)
    return DomainStatus(status, _optional_str(data, "timestamp", "top level"), tuple(nodes))


# ---------------------------------------------------------------- log table

_LETTERS: Final = {status: letter for letter, status in CONNECTION_LETTERS.items()}


def _cell(node: NodeStatus, peer_id: int) -> str:
    """Return the table letter of ``node``'s link to ``peer_id`` (``-`` if not listed)."""
    conn = node.connection_to(peer_id)
    if conn is None:
        return "-"
    return _LETTERS.get(conn.status, "?")


def format_domain_table(d: DomainStatus) -> str:
    """Render a compact table for logs: one line per node plus its links.

    Example::

        domain DEGRADED at 5/22/2025 19:46:40.891 (2 nodes)
          id host           status       version    links
           0 10.0.0.1       READY        580.95.05  C R
           1 10.0.0.2       UNAVAILABLE  -          I I

    Letters as in ``nvidia-imex-ctl -N``; ``-`` = not listed, ``?`` = a
    status spelling this module does not know.
    """
    ids = [n.node_id for n in d.nodes]
    width = max([len(n.host) for n in d.nodes] + [4])
    lines = [
        f"domain {d.status} at {d.timestamp or '?'} ({len(d.nodes)} nodes)",
        f"  {'id':>2} {'host':<{width}} {'status':<20} {'version':<10} links",
    ]
    for n in d.nodes:
        name = f" ({n.hostname})" if n.hostname else ""
        links = " ".join(_cell(n, peer) for peer in ids)
        lines.append(f"  {n.node_id:>2} {n.host:<{width}} {n.status:<20} {n.version or '-':<10} {links}{name}")
    return "\n".join(lines)
