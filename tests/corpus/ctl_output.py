"""Corpus family 4: what ``nvidia-imex-ctl`` prints (``-q`` and ``-N -j``), one case per id.

FakeHost answers ``-q`` with ``q`` (exit code, stdout) on every probe and
``-N -j`` with ``nj(addresses)``.  Through the prolog a case ends READY
(``code`` empty), not ready at the deadline (``not_ready``, 75), or fatally
at once (``daemon_failed``, 69); ``names`` must appear in the reason.
``parse`` is what the parser alone must say (``parse_query`` for ``q``,
``parse_domain_json`` for ``nj``): an OutputError text, or '' when the
output parses.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from imexctl.platform.errors import CommandError
from tests.corpus._fakes import domain_json

Answer = tuple[int, str]
NJ = Callable[[list[str]], Answer]


@dataclasses.dataclass(frozen=True)
class CtlCase:
    """One ``nvidia-imex-ctl`` answer and what the prolog (and the parser) must make of it."""

    id: str
    q: Answer = (0, "READY\n")
    nj: NJ | None = None
    code: str = ""
    exit_code: int = 0
    names: tuple[str, ...] = ()
    parse: str | None = None


def _not_ready(id_: str, *names: str, parse: str | None = None, **kw: Any) -> CtlCase:
    return CtlCase(id_, code="not_ready", exit_code=75, names=names, parse=parse, **kw)


def _fatal(id_: str, *names: str, parse: str | None = None, **kw: Any) -> CtlCase:
    return CtlCase(id_, code="daemon_failed", exit_code=69, names=names, parse=parse, **kw)


# ---------------------------------------------------------------- -q

_STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY", "INIT_GPU",
           "SHUTTING_DOWN", "UNAVAILABLE")  # fmt: skip

QUERY = [
    *(_not_ready(f"q-state-{s.lower().replace('_', '-')}", f"local {s}", q=(0, s + "\n"), parse="") for s in _STATES),
    _not_ready("q-garbage", "unknown state 'GARBAGE'", q=(0, "GARBAGE\n"), parse="unknown state 'GARBAGE'"),
    _not_ready("q-binary", "unknown state '\\x00", q=(0, "\x00\xff\xfe"), parse="unknown state"),
    _not_ready("q-empty", "empty output", q=(0, ""), parse="empty output"),
    _not_ready("q-blank-lines", "empty output", q=(0, " \n\n\t\n"), parse="empty output"),
    _not_ready("q-lower-case", "unknown state 'ready'", q=(0, "ready\n"), parse="unknown state 'ready'"),
    _not_ready("q-two-lines", "unknown state 'READY\\nREADY'", q=(0, "READY\nREADY\n"), parse="unknown state"),
    _not_ready("q-prefixed", "unknown state 'Status: READY'", q=(0, "Status: READY\n"), parse="unknown state"),
    _not_ready("q-colour-codes", "unknown state '\\x1b[32mREADY", q=(0, "\x1b[32mREADY\x1b[0m\n"),
               parse="unknown state"),
    _not_ready("q-ten-megabytes", "unknown state 'AAAA", q=(0, "A" * 10_000_000), parse="..."),
    _not_ready("q-ready-but-exit-1", "local READY (exit 1)", q=(1, "READY\n"), parse=""),
    _not_ready("q-waiting-exit-3", "local WAITING_FOR_PEERS (exit 3)", q=(3, "WAITING_FOR_PEERS\n"), parse=""),
    _fatal("q-exit-255", "nvidia-imex-ctl cannot read the node config", q=(255, "")),
    _fatal("q-not-configured", "Failed to read node configuration file",
           q=(0, "Failed to read node configuration file /run/x\n"), parse="not configured"),
    CtlCase("q-ready-crlf", q=(0, "READY\r\n"), parse=""),
    CtlCase("q-ready-padded", q=(0, "  READY  \n"), parse=""),
]  # fmt: skip

# ---------------------------------------------------------------- -N -j


def _doc(**top: Any) -> NJ:
    """A -N -j answer: the good document for the addresses, top-level keys replaced (None removes)."""

    def answer(hosts: list[str]) -> Answer:
        data = json.loads(domain_json(hosts))
        for k, v in top.items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        return 0, json.dumps(data)

    return answer


def _node(index: int, **fields: Any) -> NJ:
    """The good document with fields of node ``index`` replaced (None removes); ``raw`` replaces the node."""

    def answer(hosts: list[str]) -> Answer:
        data = json.loads(domain_json(hosts))
        node = data["nodes"][str(index)]
        if "raw" in fields:
            data["nodes"][str(index)] = fields["raw"]
        for k, v in fields.items():
            if k == "raw":
                continue
            if v is None:
                node.pop(k, None)
            else:
                node[k] = v
        return 0, json.dumps(data)

    return answer


def _text(make: Callable[[str], str]) -> NJ:
    return lambda hosts: (0, make(domain_json(hosts)))


def _nodes(make: Callable[[list[str]], list[tuple[str, str]]]) -> NJ:
    """A good document over other (node ID, address) pairs."""

    def answer(hosts: list[str]) -> Answer:
        pairs = make(hosts)
        nodes = {i: {"host": h, "status": "READY", "connections": {j: {"status": "CONNECTED"} for j, _ in pairs
                                                                    if j != i}} for i, h in pairs}  # fmt: skip
        return 0, json.dumps({"status": "UP", "nodes": nodes})

    return answer


def _hang(hosts: list[str]) -> Answer:
    raise CommandError(("nvidia-imex-ctl", "-N", "-j"), "no answer within 5s")


def _strip_optional(text: str) -> str:
    data: dict[str, Any] = json.loads(text)
    data.pop("timestamp")
    for node in data["nodes"].values():
        for key in ("version", "hostName", "changed"):
            node.pop(key)
        for conn in node["connections"].values():
            conn.pop("host")
            conn.pop("changed")
    return json.dumps(data)


_NOT_JSON = "not JSON"

DOMAIN = [
    # not JSON at all, or cut off
    _not_ready("nj-not-json", _NOT_JSON, nj=lambda h: (0, "{"), parse=_NOT_JSON),
    _not_ready("nj-empty", _NOT_JSON, nj=lambda h: (0, ""), parse=_NOT_JSON),
    _not_ready("nj-binary", _NOT_JSON, nj=lambda h: (0, "\x00\xff{"), parse=_NOT_JSON),
    *(_not_ready(f"nj-truncated-{pct}-percent", _NOT_JSON, nj=_text(lambda t, p=pct: t[:len(t) * p // 100]),
                 parse=_NOT_JSON) for pct in (1, 10, 50, 90, 99)),
    _not_ready("nj-trailing-garbage", _NOT_JSON, "Extra data", nj=_text(lambda t: t + "garbage"), parse="Extra data"),
    _not_ready("nj-two-documents", _NOT_JSON, nj=_text(lambda t: t + "\n" + t), parse="Extra data"),
    _not_ready("nj-text-table-instead", _NOT_JSON, nj=lambda h: (0, "Nodes:\nNode #0 - 10.0.0.1 - READY\n"),
               parse=_NOT_JSON),
    _not_ready("nj-not-configured-exit-255", "Failed to read node configuration file",
               nj=lambda h: (255, "Failed to read node configuration file"), parse=_NOT_JSON),
    _not_ready("nj-nested-100000-deep", "nested too deeply", nj=lambda h: (0, "[" * 100_000 + "]" * 100_000),
               parse="nested too deeply"),
    _not_ready("nj-never-answers", "ctl -N -j: no answer within 5s", nj=_hang),
    # the wrong shape
    _not_ready("nj-top-level-list", "top level is list", nj=lambda h: (0, "[]"), parse="top level is list"),
    _not_ready("nj-top-level-null", "top level is NoneType", nj=lambda h: (0, "null"), parse="top level is NoneType"),
    _not_ready("nj-top-level-string", "top level is str", nj=lambda h: (0, '"UP"'), parse="top level is str"),
    _not_ready("nj-missing-status", "top level: missing key 'status'", nj=_doc(status=None), parse="'status'"),
    _not_ready("nj-missing-nodes", "top level: missing key 'nodes'", nj=_doc(nodes=None), parse="'nodes'"),
    _not_ready("nj-status-number", "'status' is int, expected str", nj=_doc(status=1), parse="'status' is int"),
    _not_ready("nj-status-null", "'status' is NoneType", parse="'status' is NoneType",
               nj=_text(lambda t: t.replace('"status": "UP"}', '"status": null}'))),
    _not_ready("nj-nodes-list", "'nodes' is list, expected dict", nj=_doc(nodes=[]), parse="'nodes' is list"),
    _not_ready("nj-node-not-object", "nodes['0'] is str, expected object", nj=_node(0, raw="READY"),
               parse="nodes['0'] is str"),
    _not_ready("nj-node-nan", "nodes['0'] is float", nj=_text(lambda t: t.replace('"0": {', '"0": NaN, "x": {', 1)),
               parse="nodes['0'] is float"),
    _not_ready("nj-node-missing-host", "nodes['0']: missing key 'host'", nj=_node(0, host=None), parse="'host'"),
    _not_ready("nj-node-missing-status", "nodes['1']: missing key 'status'", nj=_node(1, status=None),
               parse="'status'"),
    _not_ready("nj-node-host-number", "nodes['0']: 'host' is int", nj=_node(0, host=167772161), parse="'host' is int"),
    _not_ready("nj-node-version-list", "nodes['0']: 'version' is list", nj=_node(0, version=["580"]),
               parse="'version' is list"),
    _not_ready("nj-connections-list", "nodes['0'].connections is list", nj=_node(0, connections=[]),
               parse="connections is list"),
    _not_ready("nj-connection-not-object", "connections['1'] is str", nj=_node(0, connections={"1": "C"}),
               parse="connections['1'] is str"),
    _not_ready("nj-connection-missing-status", "connections['1']: missing key 'status'",
               nj=_node(0, connections={"1": {"host": "10.0.0.2"}}), parse="missing key 'status'"),
    _not_ready("nj-node-id-word", "node ID 'zero' is not a number", parse="node ID 'zero'",
               nj=_text(lambda t: t.replace('"0": {', '"zero": {', 1))),
    _not_ready("nj-node-id-negative", "node ID '-1' is not a number", parse="node ID '-1'",
               nj=_text(lambda t: t.replace('"0": {', '"-1": {', 1))),
    _not_ready("nj-node-id-5000-digits", "is not a number below 10**9",
               nj=_text(lambda t: t.replace('"0": {', '"' + "9" * 5000 + '": {', 1)), parse="is not a number below"),
    _not_ready("nj-domain-status-5mb", "'status' is 5000000 characters long", nj=_doc(status="U" * 5_000_000),
               parse="5000000 characters long"),
    _not_ready("nj-node-status-5mb", "'status' is 5000000 characters long", nj=_node(0, status="X" * 5_000_000),
               parse="5000000 characters long"),
    _not_ready("nj-host-5mb", "'host' is 5000000 characters long", nj=_node(0, host="10.0.0.1" + "x" * 4_999_992),
               parse="5000000 characters long"),
    # states imexctl does not know, or that are not ready
    _not_ready("nj-domain-state-unknown", "domain WEIRD", nj=_doc(status="WEIRD"), parse=""),
    _not_ready("nj-domain-state-lower-case", "domain up", nj=_doc(status="up"), parse=""),
    _not_ready("nj-domain-degraded", "domain DEGRADED", nj=_doc(status="DEGRADED"), parse=""),
    _not_ready("nj-domain-down", "domain DOWN", nj=_doc(status="DOWN"), parse=""),
    _not_ready("nj-own-node-unknown-state", "own node BOOTING", nj=_node(0, status="BOOTING"), parse=""),
    _not_ready("nj-own-node-unavailable", "own node UNAVAILABLE", nj=_node(0, status="UNAVAILABLE"), parse=""),
    _not_ready("nj-connection-unknown-state", "0->1 MAYBE",
               nj=lambda h: (0, domain_json(h, conn_status="MAYBE")), parse=""),
    _not_ready("nj-connection-never-connected", "0->1 NEVER_CONNECTED",
               nj=lambda h: (0, domain_json(h, status="DEGRADED", conn_status="NEVER_CONNECTED")), parse=""),
    _fatal("nj-version-mismatch", "VERSION_MISMATCH", nj=lambda h: (0, domain_json(h, conn_status="VERSION_MISMATCH")),
           parse=""),
    _fatal("nj-node-map-mismatch", "NODE_MAP_MISMATCH",
           nj=lambda h: (0, domain_json(h, conn_status="NODE_MAP_MISMATCH")), parse=""),
    # a node list that disagrees with the job's nodes file
    _fatal("nj-nodes-other-address", "daemon reports nodes ['10.9.9.9', '10.0.0.2']",
           nj=lambda h: (0, domain_json(["10.9.9.9", *h[1:]])), parse=""),
    _fatal("nj-nodes-one-extra", "but the job's nodes file is ['10.0.0.1', '10.0.0.2']",
           nj=lambda h: (0, domain_json([*h, "10.0.0.3"])), parse=""),
    _fatal("nj-nodes-one-missing", "daemon reports nodes ['10.0.0.1']", nj=lambda h: (0, domain_json(h[:1])), parse=""),
    _fatal("nj-nodes-reordered", "daemon reports nodes ['10.0.0.2', '10.0.0.1']",
           nj=lambda h: (0, domain_json(h[::-1])), parse=""),
    _fatal("nj-nodes-none", "daemon reports nodes []", nj=_doc(nodes={}), parse=""),
    _fatal("nj-nodes-host-names", "daemon reports nodes ['gb01', 'gb02']",
           nj=lambda h: (0, domain_json(["gb01", "gb02"])), parse=""),
    _fatal("nj-node-ids-not-line-numbers", "daemon reports nodes ['0: 10.0.0.1', '2: 10.0.0.2']",
           nj=_nodes(lambda h: [("0", h[0]), ("2", h[1])]), parse=""),
    _fatal("nj-node-ids-from-one", "daemon reports nodes ['1: 10.0.0.1', '2: 10.0.0.2']",
           nj=_nodes(lambda h: [("1", h[0]), ("2", h[1])]), parse=""),
    _fatal("nj-duplicate-node-key", "daemon reports nodes ['10.0.0.2']",
           nj=_text(lambda t: t.replace('"1": {"status"', '"0": {"status"', 1)), parse=""),
    # extra and missing fields that do not matter
    CtlCase("nj-extra-fields", nj=lambda h: (0, json.dumps({**json.loads(domain_json(h)), "future": {"x": [1, 2]},
                                                            "apiVersion": 3})), parse=""),
    CtlCase("nj-extra-node-fields", nj=_node(0, gpus=[0, 1, 2, 3], uptime_s=12.5), parse=""),
    CtlCase("nj-missing-optional-fields", nj=_text(_strip_optional), parse=""),
    CtlCase("nj-own-node-lists-itself", nj=_node(0, connections={"0": {"status": "INVALID"},
                                                                 "1": {"status": "CONNECTED"}}), parse=""),
    CtlCase("nj-five-megabytes-of-extra-data", nj=_doc(padding="p" * 5_000_000), parse=""),
]  # fmt: skip


CASES = [*QUERY, *DOMAIN]


@dataclasses.dataclass(frozen=True)
class Endless:
    """A real command that never stops printing or never answers: RealHost.run must bound it."""

    id: str
    code: str
    names: tuple[str, ...]


_PY = "import sys, time\n"
ENDLESS = [
    Endless("realhost-endless-stdout", _PY + "while True: sys.stdout.write('x' * 65536)", ("printed more than",)),
    Endless("realhost-endless-stderr", _PY + "while True: sys.stderr.write('e' * 65536)", ("printed more than",)),
    Endless("realhost-endless-lines", _PY + "while True: print('READY')", ("printed more than",)),
    Endless("realhost-silent-forever", _PY + "time.sleep(3600)", ("no answer within",)),
    Endless("realhost-closes-output-keeps-running", _PY + "import os; os.close(1); os.close(2); time.sleep(3600)",
            ("no answer within",)),
    Endless("realhost-slow-trickle", _PY + "while True: print('WAITING', flush=True); time.sleep(0.05)",
            ("no answer within",)),
]  # fmt: skip
