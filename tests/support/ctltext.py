"""Parser of the human ``nvidia-imex-ctl -N`` text (test-only).

imexctl itself parses only ``-N -j`` (:mod:`imexctl.imex.ctl`).  The text form
is parsed here to check the simulator's output and the public samples in
``tests/data/`` against one another.
"""

from __future__ import annotations

from typing import Final

from imexctl.imex.ctl import CONNECTION_LETTERS, Connection, DomainStatus, NodeStatus
from imexctl.platform.errors import OutputError

__all__ = ["parse_domain_text"]


# Node line, as in design.md source ctl-n-text, widened to accept the ``*`` local-node marker
# (``* host *``), a missing Version column (older drivers) and ``- Hostname:``.
_NODE_LINE: Final = (
    r"^Node\s+#(?P<id>\d+)\s+(?P<mark>[-*])\s+(?P<host>\S+)\s+(?:\*\s+)?-\s+(?P<status>\S+)"
    r"(?:\s+-\s+Version:[ \t]*(?P<version>\S*))?"
    r"(?:\s+-\s+Hostname:[ \t]*(?P<hostname>\S*))?\s*$"
)
_HEADER: Final = r"^\s*Nodes From\\To\s+(?P<cols>.*)$"
_DOMAIN: Final = r"^Domain State:\s*(?P<state>\S+)\s*$"


class _TextParts:
    """What :func:`parse_domain_text` collects while reading lines."""

    def __init__(self) -> None:
        self.timestamp = ""
        self.nodes: dict[int, tuple[str, str, str, str]] = {}
        self.columns: list[int] | None = None
        self.rows: dict[int, list[str]] = {}
        self.state: str | None = None


def _parse_columns(cols: str) -> list[int]:
    """Return the peer IDs of the table header."""
    out = []
    for token in cols.split():
        if not token.isdigit():
            raise OutputError(f"nvidia-imex-ctl -N: table header: column {token!r} is not a node ID")
        out.append(int(token))
    return out


def _parse_row(line: str, columns: list[int]) -> tuple[int, list[str]]:
    """Return ``(from_id, statuses)`` for one table row."""
    tokens = line.split()
    if not tokens[0].isdigit():
        raise OutputError(f"nvidia-imex-ctl -N: table row {line.strip()!r}: {tokens[0]!r} is not a node ID")
    cells = tokens[1:]
    if len(cells) != len(columns):
        raise OutputError(
            f"nvidia-imex-ctl -N: table row {line.strip()!r}: {len(cells)} cells for {len(columns)} columns"
        )
    for cell in cells:
        if cell not in CONNECTION_LETTERS:
            raise OutputError(f"nvidia-imex-ctl -N: table row {line.strip()!r}: unknown cell {cell!r}")
    return int(tokens[0]), [CONNECTION_LETTERS[c] for c in cells]


def _read_line(line: str, parts: _TextParts) -> None:
    """Feed one line of ``-N`` text into ``parts``."""
    import re

    in_table = parts.columns is not None and parts.state is None and line.strip()
    if in_table and not line.lstrip().startswith("Domain State:"):
        row_id, statuses = _parse_row(line, parts.columns)  # type: ignore[arg-type]
        parts.rows[row_id] = statuses
        return
    if m := re.match(_NODE_LINE, line):
        parts.nodes[int(m["id"])] = (m["host"], m["status"], m["version"] or "", m["hostname"] or "")
    elif m := re.match(_HEADER, line):
        parts.columns = _parse_columns(m["cols"])
    elif m := re.match(_DOMAIN, line.strip()):
        parts.state = m["state"]
    elif re.match(r"^\d{1,2}/\d{1,2}/\d{4} \d{1,2}:\d{2}:\d{2}\.\d{3}$", line.strip()):
        parts.timestamp = line.strip()
    elif line.startswith("Node #"):
        raise OutputError(f"nvidia-imex-ctl -N: unparseable node line {line!r}")


def _assemble(parts: _TextParts) -> DomainStatus:
    """Check that the pieces fit together and build the :class:`DomainStatus`."""
    if parts.state is None:
        raise OutputError("nvidia-imex-ctl -N: no 'Domain State:' line")
    if parts.columns is None:
        raise OutputError("nvidia-imex-ctl -N: no 'Nodes From\\To' connectivity table")
    if set(parts.columns) != set(parts.nodes) or set(parts.rows) != set(parts.nodes):
        raise OutputError(
            f"nvidia-imex-ctl -N: node lines {sorted(parts.nodes)}, table columns "
            f"{sorted(parts.columns)} and table rows {sorted(parts.rows)} do not match"
        )
    nodes = []
    for node_id in sorted(parts.nodes):
        host, status, version, hostname = parts.nodes[node_id]
        conns = tuple(
            Connection(peer, parts.nodes[peer][0], st) for peer, st in sorted(zip(parts.columns, parts.rows[node_id]))
        )
        nodes.append(NodeStatus(node_id, host, status, version, hostname, conns))
    return DomainStatus(parts.state, parts.timestamp, tuple(nodes))


def parse_domain_text(text: str) -> DomainStatus:
    """Parse the human ``nvidia-imex-ctl -N`` output, with or without ``-H``.

    Accepts the 570.172 layout of design.md source ctl-n-text, the older layout without a
    Version column, the ``* host *`` local-node marker and a trailing
    ``- Hostname: name``.  Table letters become the ``-j`` spellings of
    :data:`CONNECTION_LETTERS`.  Prefer :func:`parse_domain_json`; this is
    for logs and for checking what humans see.

    Raises:
        OutputError: a table row or node line does not parse, a section is
            missing, or node lines, columns and rows disagree.
    """
    parts = _TextParts()
    for line in text.splitlines():
        _read_line(line, parts)
    return _assemble(parts)
