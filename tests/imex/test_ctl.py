"""Tests for imexctl.imex.ctl: parsers of ``nvidia-imex-ctl`` output, against real samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imexctl.imex.ctl import (
    CONNECTION_LETTERS,
    QUERY_STATES,
    Connection,
    DomainStatus,
    NodeStatus,
    format_domain_table,
    parse_domain_json,
    parse_query,
)
from imexctl.platform.errors import OutputError
from tests.support.ctltext import parse_domain_text

DATA = Path(__file__).parents[1] / "data"

AWS_HOSTS = [
    "172.31.48.81",
    "172.31.48.98",
    "172.31.48.221",
    "172.31.49.228",
    "172.31.50.39",
    "172.31.50.44",
    "172.31.51.66",
    "172.31.51.157",
    "172.31.52.239",
    "172.31.53.80",
    "172.31.54.95",
    "172.31.54.183",
    "172.31.54.203",
    "172.31.54.241",
    "172.31.55.59",
    "172.31.55.187",
    "172.31.55.197",
    "172.31.56.47",
]


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


Q_SAMPLES = json.loads(_read("imexctl_q_samples.json"))


class TestParseQuery:
    @pytest.mark.parametrize("sample", [pytest.param(s, id=s["id"]) for s in Q_SAMPLES if "state" in s])
    def test_known_states(self, sample: dict[str, str]) -> None:
        """Every documented -q word parses to itself, surrounding whitespace ignored."""
        assert sample["state"] == parse_query(sample["output"])

    @pytest.mark.parametrize("sample", [pytest.param(s, id=s["id"]) for s in Q_SAMPLES if "error" in s])
    def test_bad_outputs(self, sample: dict[str, str]) -> None:
        """Unparseable -q output raises OutputError naming the problem."""
        with pytest.raises(OutputError, match=sample["error"]):
            parse_query(sample["output"])

    def test_state_list(self) -> None:
        """QUERY_STATES holds the eight states of design.md source ctl-q-states in DCGM's order."""
        assert QUERY_STATES == (
            "INITIALIZING",
            "STARTING_AUTH_SERVER",
            "WAITING_FOR_PEERS",
            "WAITING_FOR_RECOVERY",
            "INIT_GPU",
            "READY",
            "SHUTTING_DOWN",
            "UNAVAILABLE",
        )

    def test_error_quotes_text(self) -> None:
        """The error message quotes the unexpected text."""
        with pytest.raises(OutputError, match="'NOT_A_STATE'"):
            parse_query("NOT_A_STATE\n")

    def test_not_configured_quotes_line(self) -> None:
        """A not-configured answer is reported with the path it names."""
        with pytest.raises(OutputError, match="/x/nodes.cfg"):
            parse_query("Failed to read node configuration file /x/nodes.cfg\n")


class TestParseDomainJson:
    def test_dcgm_sample(self) -> None:
        """The DCGM 580.30 sample parses: DEGRADED, two nodes, self entry kept."""
        d = parse_domain_json(_read("imexctl_Nj_580.30_degraded_dcgm.json"))
        assert (d.status, d.timestamp) == ("DEGRADED", "5/22/2025 19:46:40.891")
        assert [n.node_id for n in d.nodes] == [1, 3]
        n1 = d.node(1)
        assert n1 is not None
        assert (n1.host, n1.status, n1.version, n1.hostname) == ("10.76.183.30", "READY", "580.30", "")
        assert (
            Connection(0, "10.76.179.115", "CONNECTED"),
            Connection(1, "10.76.183.30", "CONNECTED"),
        ) == n1.connections
        assert (Connection(0, "10.76.179.115", "CONNECTED"),) == n1.peer_connections()
        assert d.not_connected() == []

    def test_isv_unavailable_sample(self) -> None:
        """A down peer reads as UNAVAILABLE with INVALID links; helpers find it."""
        d = parse_domain_json(_read("imexctl_Nj_isv_unavailable_completed.json"))
        assert not d.is_up
        own = d.node_by_host("10.0.0.1")
        assert own is not None and own.is_ready and own.hostname == "gpu-node-1"
        assert d.node_by_host("gpu-node-1") is own
        assert d.not_connected() == [(1, 0, "INVALID")]
        assert d.not_connected(include_self=True) == [(1, 0, "INVALID"), (1, 1, "INVALID")]
        assert d.node_by_host("10.9.9.9") is None

    def test_minimal_and_extra_keys(self) -> None:
        """Optional keys default to empty and unknown keys are ignored."""
        text = '{"nodes":{"0":{"status":"READY","host":"h","future":1}},"status":"UP","new":[1]}'
        assert DomainStatus("UP", "", (NodeStatus(0, "h", "READY", "", "", ()),)) == parse_domain_json(text)

    def test_unknown_spellings_are_kept(self) -> None:
        """Unconfirmed status spellings are kept verbatim, not rejected."""
        text = '{"nodes":{"0":{"status":"WEIRD","host":"h","connections":{"0":{"host":"h","status":"ODD"}}}},"status":"MAYBE"}'
        d = parse_domain_json(text)
        assert (d.status, d.nodes[0].status, d.nodes[0].connections[0].status) == ("MAYBE", "WEIRD", "ODD")

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            pytest.param("", "not JSON", id="empty"),
            pytest.param("READY\n", "not JSON", id="q-output"),
            pytest.param('{"status":', "not JSON", id="truncated"),
            pytest.param("[1, 2]", "top level is list", id="list"),
            pytest.param('{"nodes":{}}', "missing key 'status'", id="no-status"),
            pytest.param('{"status":"UP"}', "missing key 'nodes'", id="no-nodes"),
            pytest.param('{"status":5,"nodes":{}}', "'status' is int", id="status-int"),
            pytest.param('{"status":"UP","nodes":[]}', "'nodes' is list", id="nodes-list"),
            pytest.param('{"status":"UP","nodes":{"x":{}}}', "node ID 'x'", id="node-id"),
            pytest.param('{"status":"UP","nodes":{"0":"READY"}}', r"nodes\['0'\] is str", id="node-str"),
            pytest.param('{"status":"UP","nodes":{"0":{"status":"READY"}}}', "missing key 'host'", id="no-host"),
            pytest.param(
                '{"status":"UP","nodes":{"0":{"host":"h"}}}', r"nodes\['0'\]: missing key 'status'", id="no-node-status"
            ),
            pytest.param(
                '{"status":"UP","nodes":{"0":{"host":"h","status":"READY","connections":[]}}}',
                "connections is list",
                id="connections-list",
            ),
            pytest.param(
                '{"status":"UP","nodes":{"0":{"host":"h","status":"READY","connections":{"1":"C"}}}}',
                r"connections\['1'\] is str",
                id="connection-str",
            ),
            pytest.param(
                '{"status":"UP","nodes":{"0":{"host":"h","status":"READY","connections":{"1":{"host":"h"}}}}}',
                "missing key 'status'",
                id="connection-no-status",
            ),
            pytest.param(
                '{"status":"UP","nodes":{"0":{"host":"h","status":"READY","version":17}}}',
                "'version' is int",
                id="version-int",
            ),
        ],
    )
    def test_garbage(self, text: str, named: str) -> None:
        """Garbage raises OutputError naming what was wrong."""
        with pytest.raises(OutputError, match=named):
            parse_domain_json(text)


class TestParseDomainText:
    def test_aws_18_nodes(self) -> None:
        """The complete 570.172 sample parses to 18 READY nodes, all 324 links CONNECTED, UP."""
        d = parse_domain_text(_read("imexctl_N_570.172_18nodes.txt"))
        assert (d.status, d.timestamp) == ("UP", "5/4/2026 06:08:10.580")
        assert [n.host for n in d.nodes] == AWS_HOSTS
        assert list(range(18)) == [n.node_id for n in d.nodes]
        assert {("READY", "570.172", "")} == {(n.status, n.version, n.hostname) for n in d.nodes}
        assert sum(len(n.connections) for n in d.nodes) == 324
        assert d.not_connected(include_self=True) == []
        node17 = d.node(17)
        assert node17 is not None and Connection(10, "172.31.54.95", "CONNECTED") == node17.connection_to(10)

    def test_elided_sample_is_refused(self) -> None:
        """The '...' elision of the quoted sample is not real output and is refused."""
        with pytest.raises(OutputError, match=r"'\.\.\.'"):
            parse_domain_text(_read("imexctl_N_570.172_elided.txt"))

    def test_old_layout_without_version(self) -> None:
        """The 570.00 layout (no Version column, 3-wide cells) parses with empty versions."""
        d = parse_domain_text(_read("imexctl_N_570.00_2nodes_old.txt"))
        assert (d.status, d.timestamp) == ("UP", "3/25/2025 10:42:08.082")
        assert [(n.host, n.status, n.version) for n in d.nodes] == [
            ("10.136.206.47", "READY", ""),
            ("10.136.206.48", "READY", ""),
        ]

    def test_local_marker_and_hostname(self) -> None:
        """The 580.95.09 -H node lines (with the '* host *' marker) parse host, version and host name."""
        lines = _read("imexctl_N_H_580.95.09_nodelines.txt")
        text = (
            "5/4/2026 06:08:10.580\nNodes:\n"
            + lines
            + "\n Nodes From\\To  0   4\n       0        C   C\n       4        C   C\n\nDomain State: UP\n"
        )
        d = parse_domain_text(text)
        assert [(n.node_id, n.host, n.status, n.version, n.hostname) for n in d.nodes] == [
            (0, "180.100.41.183", "READY", "580.95.09", "MKE030104700112"),
            (4, "180.100.41.232", "READY", "580.95.09", "MKE030104700131"),
        ]

    def test_text_and_json_agree(self) -> None:
        """The constructed -N -H text and the ISV JSON sample parse to the same domain."""
        from_text = parse_domain_text(_read("imexctl_N_isv_unavailable_constructed.txt"))
        from_json = parse_domain_json(_read("imexctl_Nj_isv_unavailable_completed.json"))
        assert from_json == from_text

    @pytest.mark.parametrize(("letter", "status"), list(CONNECTION_LETTERS.items()), ids=list(CONNECTION_LETTERS))
    def test_every_letter(self, letter: str, status: str) -> None:
        """Each table letter maps to its -j spelling."""
        text = f"Node #0   - h0              - READY\nNode #1   - h1              - READY\n Nodes From\\To  0   1\n       0        C   {letter}\n       1        C   C\nDomain State: DEGRADED\n"
        node0 = parse_domain_text(text).node(0)
        assert node0 is not None and Connection(1, "h1", status) == node0.connection_to(1)

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            pytest.param("", "no 'Domain State:' line", id="empty"),
            pytest.param("READY\n", "no 'Domain State:' line", id="q-output"),
            pytest.param("Node #0   - h - READY\nDomain State: UP\n", "no 'Nodes From", id="no-table"),
            pytest.param("Node #0 h READY\n", "unparseable node line", id="bad-node-line"),
            pytest.param(" Nodes From\\To  0   x\n", "column 'x'", id="bad-column"),
            pytest.param(
                "Node #0   - h - READY\n Nodes From\\To  0\n       0        Q\nDomain State: UP\n",
                "unknown cell 'Q'",
                id="bad-cell",
            ),
            pytest.param(
                "Node #0   - h - READY\n Nodes From\\To  0\n       0        C   C\nDomain State: UP\n",
                "2 cells for 1 columns",
                id="too-many-cells",
            ),
            pytest.param(
                "Node #0   - h - READY\n Nodes From\\To  0   1\n       0        C   C\nDomain State: UP\n",
                "do not match",
                id="missing-node",
            ),
            pytest.param(
                "Node #0   - h - READY\n Nodes From\\To  0\n       x        C\nDomain State: UP\n",
                "'x' is not a node ID",
                id="bad-row-id",
            ),
        ],
    )
    def test_garbage(self, text: str, named: str) -> None:
        """Garbage raises OutputError naming what was wrong."""
        with pytest.raises(OutputError, match=named):
            parse_domain_text(text)


class TestFormatDomainTable:
    def test_one_line_per_node(self) -> None:
        """The log table has a header plus one line per node with its link letters."""
        d = parse_domain_json(_read("imexctl_Nj_isv_unavailable_completed.json"))
        lines = format_domain_table(d).splitlines()
        assert lines[0] == "domain DEGRADED at 9/4/2026 00:37:39.905 (2 nodes)"
        assert lines[2].split() == ["0", "10.0.0.1", "READY", "580.95.05", "C", "C", "(gpu-node-1)"]
        assert lines[3].split() == ["1", "10.0.0.2", "UNAVAILABLE", "-", "I", "I"]

    def test_unlisted_and_unknown_links(self) -> None:
        """A link that is not listed shows '-', an unknown spelling '?'."""
        node = NodeStatus(0, "h", "READY", "v", "", (Connection(0, "h", "SOMETHING_NEW"),))
        d = DomainStatus("DEGRADED", "", (node, NodeStatus(1, "g", "READY", "v", "", ())))
        assert format_domain_table(d).splitlines()[2].split()[-2:] == ["?", "-"]
