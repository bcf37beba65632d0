"""Render a domain snapshot the way ``nvidia-imex-ctl -N`` (text) and ``-N -j`` print it.

A *snapshot* is the plain dict the simulated ctl assembles from every node's
answer; its shape is the ``-N -j`` JSON of design.md source ctl-n-json::

    {"nodes": {"0": {"status": "READY", "host": "10.0.0.1",
                     "connections": {"0": {"host": "10.0.0.1", "status": "CONNECTED", "changed": True}},
                     "changed": True, "version": "580.95.05", "hostName": "tray01"}},
     "timestamp": "5/4/2026 06:08:10.580", "status": "UP"}

This module deliberately does not use imexctl's parser types, so that the
parser and the simulator are checked against the same samples independently.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "LEGEND",
    "STATUS_LETTERS",
    "answered_entry",
    "assemble_snapshot",
    "domain_state",
    "format_json",
    "format_text",
    "format_timestamp",
    "node_entry",
    "unavailable_snapshot",
    "unreachable_entry",
]

#: Legend printed at the top of ``-N`` (design.md source ctl-n-text, "triggreed" verbatim).
LEGEND: Final = (
    "Connectivity Table Legend:\n"
    "I - Invalid - Node wasn't reachable, no connection status available\n"
    "N - Never Connected\n"
    "R - Recovering - Connection was lost, but clean up has not yet been triggered.\n"
    "D - Disconnected - Connection was lost, and clean up has been triggreed.\n"
    "A - Authenticating - If GSSAPI enabled, client has initiated mutual authentication.\n"
    "!V! - Version mismatch, communication disabled.\n"
    "!M! - Node map mismatch, communication disabled.\n"
    "C - Connected - Ready for operation\n"
)

#: ``-N -j`` connection status -> ``-N`` table letter.
STATUS_LETTERS: Final[Mapping[str, str]] = {
    "CONNECTED": "C",
    "INVALID": "I",
    "NEVER_CONNECTED": "N",
    "RECOVERING": "R",
    "DISCONNECTED": "D",
    "AUTHENTICATING": "A",
    "VERSION_MISMATCH": "!V!",
    "NODE_MAP_MISMATCH": "!M!",
}

_ROW_LABEL: Final = 8
_LABEL_GAP: Final = " " * 8
_CELL: Final = 4


def format_timestamp(when: float | None = None) -> str:
    """Return local time as ``M/D/YYYY HH:MM:SS.mmm`` (``5/4/2026 06:08:10.580``)."""
    when = time.time() if when is None else when
    tm = time.localtime(when)
    millis = round((when - int(when)) * 1000) % 1000
    return f"{tm.tm_mon}/{tm.tm_mday}/{tm.tm_year} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{millis:03d}"


def domain_state(nodes: Mapping[str, Mapping[str, Any]], local_id: int | None) -> str:
    """Return ``UP``, ``DEGRADED`` or ``DOWN`` for a snapshot's ``nodes``.

    UP: every node READY and every connection (the diagonal included)
    CONNECTED.  DOWN: no node is READY, or the local node (``local_id``: the
    node whose address the config binds the command service to; ``None`` when
    the ctl cannot tell) is not.  DEGRADED: anything in between.
    """
    ready = {k for k, n in nodes.items() if n.get("status") == "READY"}
    if not ready or (local_id is not None and str(local_id) not in ready):
        return "DOWN"
    links_ok = all(c.get("status") == "CONNECTED" for n in nodes.values() for c in n.get("connections", {}).values())
    return "UP" if links_ok and len(ready) == len(nodes) else "DEGRADED"


def _ordered(nodes: Mapping[str, Any]) -> list[str]:
    """Return node keys in numeric order."""
    return sorted(nodes, key=int)


def _node_line(key: str, node: Mapping[str, Any], hostnames: bool) -> str:
    """Return one ``Node #`` line, widths as in the 570.172 sample."""
    line = f"Node #{key:<3} - {node['host']:<15} - {node['status']:<20} - Version: {node.get('version', '')}"
    if hostnames:
        line += f"   - Hostname: {node.get('hostName', '')}"
    return line.rstrip()


def _table(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Return the connectivity table lines (header and one row per node)."""
    keys = _ordered(nodes)
    lines = [(" Nodes From\\To  " + "".join(f"{k:<{_CELL}}" for k in keys)).rstrip()]
    for key in keys:
        conns = nodes[key].get("connections", {})
        cells = [STATUS_LETTERS.get(conns.get(k, {}).get("status", "INVALID"), "I") for k in keys]
        lines.append((f"{key:>{_ROW_LABEL}}{_LABEL_GAP}" + "".join(f"{c:<{_CELL}}" for c in cells)).rstrip())
    return lines


def format_text(snapshot: Mapping[str, Any], *, hostnames: bool = False) -> str:
    """Render ``nvidia-imex-ctl -N`` text (``-H`` adds ``- Hostname: <name>``)."""
    nodes = snapshot["nodes"]
    body = [snapshot["timestamp"], "Nodes:"]
    body += [_node_line(k, nodes[k], hostnames) for k in _ordered(nodes)]
    body += ["", *_table(nodes), "", f"Domain State: {snapshot['status']}"]
    return LEGEND + "\n" + "\n".join(body) + "\n"


def format_json(snapshot: Mapping[str, Any], *, hostnames: bool = False) -> str:
    """Render ``nvidia-imex-ctl -N -j``; ``hostName`` is blank unless ``hostnames``."""
    nodes = {}
    for key in _ordered(snapshot["nodes"]):
        node = dict(snapshot["nodes"][key])
        node["hostName"] = node.get("hostName", "") if hostnames else ""
        nodes[key] = node
    out = {"nodes": nodes, "timestamp": snapshot["timestamp"], "status": snapshot["status"]}
    return json.dumps(out, separators=(",", ":")) + "\n"


def node_entry(
    host: str, status: str, version: str, hostname: str, connections: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Return one ``nodes`` entry with the key order of the DCGM sample."""
    return {
        "status": status,
        "host": host,
        "connections": {k: dict(v) for k, v in connections.items()},
        "changed": True,
        "version": version,
        "hostName": hostname,
    }


def unreachable_entry(host: str, hosts: Sequence[str]) -> dict[str, Any]:
    """The ``nodes`` entry of a node whose command service did not answer: UNAVAILABLE, all ``I``."""
    conns = {str(j): {"host": h, "status": "INVALID", "changed": True} for j, h in enumerate(hosts)}
    return node_entry(host, "UNAVAILABLE", "", "", conns)


def answered_entry(host: str, hosts: Sequence[str], answer: Mapping[str, Any]) -> dict[str, Any]:
    """The ``nodes`` entry built from one node's own answer (state, version, host name, row)."""
    row = answer.get("row") or {}
    conns = {
        str(j): {"host": h, "status": str(row.get(str(j), "INVALID")), "changed": True} for j, h in enumerate(hosts)
    }
    return node_entry(
        host, str(answer.get("state")), str(answer.get("version", "")), str(answer.get("hostname", "")), conns
    )


def assemble_snapshot(
    hosts: Sequence[str], answers: Sequence[Mapping[str, Any] | None], local_id: int | None, when: float | None = None
) -> dict[str, Any]:
    """The ``-N`` snapshot from every node's answer (``None``: that node could not be reached)."""
    nodes = {
        str(i): unreachable_entry(h, hosts) if a is None else answered_entry(h, hosts, a)
        for i, (h, a) in enumerate(zip(hosts, answers))
    }
    return {"nodes": nodes, "timestamp": format_timestamp(when), "status": domain_state(nodes, local_id)}


def unavailable_snapshot(entries: Iterable[str], when: float | None = None) -> dict[str, Any]:
    """Return the snapshot when no node answers: all UNAVAILABLE, DOWN."""
    hosts = list(entries)
    return assemble_snapshot(hosts, [None] * len(hosts), None, when)
