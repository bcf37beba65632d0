"""domain: NVLink-domain membership from a topology file, and one address per tray."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.errors import ConfigError, ResolveError
from imexctl.members import domain_members, parse_hosts_file, parse_topology, resolve_all
from tests.support.fakes import FakeHost

TOPOLOGY = """\
# two NVL72 racks
BlockName=rackA Nodes=gb[01-03]
BlockName=rackB Nodes=gb[04-05],gb07
BlockSizes=3,6
SwitchName=s1 Nodes=gb[01-07]

   # indented comment
"""


class TestParseTopology:
    def test_maps_every_node_to_its_block(self) -> None:
        """Each node of a BlockName line maps to that block."""
        owner = parse_topology(TOPOLOGY, "topo")
        assert owner == {
            "gb01": "rackA",
            "gb02": "rackA",
            "gb03": "rackA",
            "gb04": "rackB",
            "gb05": "rackB",
            "gb07": "rackB",
        }

    def test_ignores_other_lines(self) -> None:
        """SwitchName=, BlockSizes=, comments and blank lines add no node."""
        owner = parse_topology("SwitchName=s1 Nodes=gb[01-09]\nBlockSizes=4\n\n# BlockName=x Nodes=gb01\n", "t")
        assert owner == {}

    def test_trailing_comment_on_block_line(self) -> None:
        """A comment after a block line is ignored."""
        assert parse_topology("BlockName=b1 Nodes=gb01  # first\n", "t") == {"gb01": "b1"}

    def test_node_in_two_blocks_is_refused(self) -> None:
        """A node listed in two different blocks is an error naming file, line, node and both blocks."""
        with pytest.raises(ConfigError) as info:
            parse_topology("BlockName=b1 Nodes=gb[01-02]\nBlockName=b2 Nodes=gb02\n", "/etc/topo.conf")
        assert "/etc/topo.conf:2" in str(info.value)
        assert all(word in str(info.value) for word in ("gb02", "b1", "b2"))

    @pytest.mark.parametrize(
        "line",
        [
            pytest.param("BlockName=b1", id="no-nodes"),
            pytest.param("BlockName= Nodes=gb01", id="empty-name"),
            pytest.param("BlockName=b1 Nodes=", id="empty-nodes"),
        ],
    )
    def test_incomplete_block_line_is_refused(self, line: str) -> None:
        """A block line without a name or nodes is an error naming file and line."""
        with pytest.raises(ConfigError, match=r"^topo:1: block line needs"):
            parse_topology(line + "\n", "topo")

    def test_malformed_node_list_is_a_config_error_with_location(self) -> None:
        """A bad Nodes= hostlist is a ConfigError naming file, line and the faulty part."""
        with pytest.raises(ConfigError, match=r"^/etc/topo.conf:2: .*gb\[01-"):
            parse_topology("BlockName=b0 Nodes=gb09\nBlockName=b1 Nodes=gb[01-\n", "/etc/topo.conf")


class TestDomainMembers:
    @pytest.fixture
    def topo(self, tmp_path: Path) -> Path:
        path = tmp_path / "topology.conf"
        path.write_text(TOPOLOGY)
        return path

    def test_without_topology_all_nodes_in_order(self) -> None:
        """Without a topology file every node of the job is a member, in node-list order."""
        assert domain_members(["gb05", "gb01", "gb03"], "gb01", None) == ("gb05", "gb01", "gb03")

    def test_keeps_only_own_block_in_node_list_order(self, topo: Path) -> None:
        """Only the trays in this tray's block are members, in the job's node-list order."""
        nodes = ["gb07", "gb02", "gb04", "gb01", "gb05"]
        assert domain_members(nodes, "gb04", topo) == ("gb07", "gb04", "gb05")
        assert domain_members(nodes, "gb01", topo) == ("gb02", "gb01")

    def test_node_not_in_any_block_is_an_error(self, topo: Path) -> None:
        """A tray that is in no block of the topology file fails with its name."""
        with pytest.raises(ConfigError, match="gb06 is in no BlockName"):
            domain_members(["gb01", "gb06"], "gb06", topo)

    def test_job_node_outside_blocks_is_left_out(self, topo: Path) -> None:
        """A job node that is in no block is simply not a member of this tray's domain."""
        assert domain_members(["gb01", "gb06", "gb02"], "gb01", topo) == ("gb01", "gb02")

    def test_missing_topology_file_is_a_config_error(self, tmp_path: Path) -> None:
        """A configured topology file that does not exist is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="topology file .*nope"):
            domain_members(["gb01"], "gb01", tmp_path / "nope")

    def test_symlinked_topology_file_is_refused(self, tmp_path: Path, topo: Path) -> None:
        """A topology file that is a symlink is not followed."""
        (tmp_path / "link").symlink_to(topo)
        with pytest.raises(ConfigError, match="cannot read topology file"):
            domain_members(["gb01"], "gb01", tmp_path / "link")


class TestParseHostsFile:
    def test_maps_names_and_aliases(self) -> None:
        """Every name on a line maps to the line's address; comments and blank lines are skipped."""
        text = "# trays\n10.0.0.1 gb01 gb01-ib\n\n10.0.0.2\tgb02   # second\nfd00::3 gb03\n"
        assert parse_hosts_file(text, "h") == {
            "gb01": "10.0.0.1",
            "gb01-ib": "10.0.0.1",
            "gb02": "10.0.0.2",
            "gb03": "fd00::3",
        }

    @pytest.mark.parametrize(
        ("text", "lineno"),
        [
            pytest.param("10.0.0.1\n", 1, id="address-only"),
            pytest.param("10.0.0.1 gb01\ngb02 10.0.0.2\n", 2, id="name-first"),
            pytest.param("10.0.0.300 gb01\n", 1, id="bad-octet"),
            pytest.param("# c\n\nlocalhost gb01\n", 3, id="name-as-address"),
        ],
    )
    def test_malformed_line_names_file_and_line(self, text: str, lineno: int) -> None:
        """A line that is not ADDRESS NAME... is an error naming file and line number."""
        with pytest.raises(ConfigError, match=rf"^/etc/imexctl/hosts:{lineno}: expected 'ADDRESS NAME"):
            parse_hosts_file(text, "/etc/imexctl/hosts")

    def test_name_with_two_addresses_is_refused(self) -> None:
        """One name given two different addresses is an error naming both."""
        with pytest.raises(ConfigError, match=r"h:2: gb01 has two addresses \(10.0.0.1, 10.0.0.9\)"):
            parse_hosts_file("10.0.0.1 gb01\n10.0.0.9 gb01\n", "h")

    def test_same_address_repeated_is_fine(self) -> None:
        """Repeating a name with the same address is accepted."""
        assert parse_hosts_file("10.0.0.1 gb01\n10.0.0.1 gb01\n", "h") == {"gb01": "10.0.0.1"}


def _host(addresses: dict[str, list[str]]) -> FakeHost:
    return FakeHost(addresses=addresses)


class TestResolveDns:
    def test_one_address_per_tray_in_order(self, tmp_path: Path) -> None:
        """Each tray resolves to its one IPv4 address, in the order given."""
        host = _host({"gb02": ["10.0.0.2"], "gb01": ["10.0.0.1"]})
        assert resolve_all(["gb02", "gb01"], method="dns", host=host, hosts_file=tmp_path / "h") == (
            "10.0.0.2",
            "10.0.0.1",
        )

    def test_loopback_and_ipv6_are_dropped(self, tmp_path: Path) -> None:
        """Loopback and IPv6 addresses are ignored when exactly one usable IPv4 remains."""
        host = _host({"gb01": ["127.0.1.1", "fd00::1", "10.0.0.1"]})
        assert resolve_all(["gb01"], method="dns", host=host, hosts_file=tmp_path / "h") == ("10.0.0.1",)

    def test_several_ipv4_addresses_are_ambiguous(self, tmp_path: Path) -> None:
        """A tray with two usable IPv4 addresses is an error that lists both and points to hosts_file."""
        host = _host({"gb01": ["10.0.0.1", "192.168.0.1"]})
        with pytest.raises(ResolveError, match=r"gb01: ambiguous.*10\.0\.0\.1.*192\.168\.0\.1.*hosts_file"):
            resolve_all(["gb01"], method="dns", host=host, hosts_file=tmp_path / "h")

    def test_ipv6_only_is_an_error(self, tmp_path: Path) -> None:
        """A tray with only IPv6 (and loopback) addresses fails and shows what the resolver gave."""
        host = _host({"gb01": ["::1", "fd00::1"]})
        with pytest.raises(ResolveError, match=r"gb01: no non-loopback IPv4 address.*fd00::1"):
            resolve_all(["gb01"], method="dns", host=host, hosts_file=tmp_path / "h")

    def test_loopback_only_is_an_error(self, tmp_path: Path) -> None:
        """A tray that resolves only to loopback (a bad /etc/hosts) fails."""
        host = _host({"gb01": ["127.0.1.1"]})
        with pytest.raises(ResolveError, match="gb01: no non-loopback IPv4"):
            resolve_all(["gb01"], method="dns", host=host, hosts_file=tmp_path / "h")

    def test_every_failing_name_is_reported(self, tmp_path: Path) -> None:
        """All trays that fail are named in one error, not just the first."""
        host = _host({"gb01": ["10.0.0.1"], "gb03": ["fd00::3"]})
        with pytest.raises(ResolveError) as info:
            resolve_all(["gb01", "gb02", "gb03", "gb04"], method="dns", host=host, hosts_file=tmp_path / "h")
        message = str(info.value)
        assert all(f"gb0{i}:" in message for i in (2, 3, 4)) and "gb01:" not in message

    def test_two_trays_with_one_address_are_refused(self, tmp_path: Path) -> None:
        """Two trays resolving to the same address are an error naming both trays and the address."""
        host = _host({"gb01": ["10.0.0.1"], "gb02": ["10.0.0.2"], "gb03": ["10.0.0.1"]})
        with pytest.raises(ResolveError, match="gb01 and gb03 resolve to the same address 10.0.0.1"):
            resolve_all(["gb01", "gb02", "gb03"], method="dns", host=host, hosts_file=tmp_path / "h")


class TestResolveHostsFile:
    def test_uses_the_file_and_not_dns(self, tmp_path: Path) -> None:
        """With method hosts_file the static map decides, exactly as written, without asking DNS."""
        (tmp_path / "hosts").write_text("10.1.0.1 gb01\n10.1.0.2 gb02\n")
        host = _host({"gb01": ["10.0.0.1"], "gb02": ["10.0.0.2"]})
        assert resolve_all(["gb01", "gb02"], method="hosts_file", host=host, hosts_file=tmp_path / "hosts") == (
            "10.1.0.1",
            "10.1.0.2",
        )

    def test_names_missing_from_file_are_all_reported(self, tmp_path: Path) -> None:
        """Every tray absent from the hosts file is named, with the file."""
        (tmp_path / "hosts").write_text("10.1.0.1 gb01\n")
        with pytest.raises(ResolveError, match=r"gb02: not in .*hosts; gb03: not in"):
            resolve_all(["gb01", "gb02", "gb03"], method="hosts_file", host=_host({}), hosts_file=tmp_path / "hosts")

    def test_duplicate_addresses_in_file_are_refused(self, tmp_path: Path) -> None:
        """Two trays given one address in the hosts file are refused."""
        (tmp_path / "hosts").write_text("10.1.0.1 gb01 gb02\n")
        with pytest.raises(ResolveError, match="same address"):
            resolve_all(["gb01", "gb02"], method="hosts_file", host=_host({}), hosts_file=tmp_path / "hosts")

    def test_missing_hosts_file_is_a_config_error(self, tmp_path: Path) -> None:
        """A hosts file that does not exist is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="cannot read hosts file .*nope"):
            resolve_all(["gb01"], method="hosts_file", host=_host({}), hosts_file=tmp_path / "nope")

    def test_non_utf8_hosts_file_is_a_config_error(self, tmp_path: Path) -> None:
        """A hosts file with bytes that are not UTF-8 is a ConfigError, not a crash."""
        (tmp_path / "hosts").write_bytes(b"10.1.0.1 gb01 \xe9t\xe9\n")
        with pytest.raises(ConfigError, match="not UTF-8"):
            resolve_all(["gb01"], method="hosts_file", host=_host({}), hosts_file=tmp_path / "hosts")
