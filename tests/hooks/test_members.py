"""members: NVLink-domain membership from a topology source, the NVML cross-check, and one address per tray."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.hooks.members import (
    Place,
    channel_place,
    cliques,
    cross_check,
    domain_members,
    job_domain,
    keyless_blocks,
    largest_clique,
    parse_hosts_file,
    resolve_all,
)
from imexctl.platform.errors import ConfigError, ResolveError, TopologyMismatch
from imexctl.slurm.topofile import BlockMap, parse_map, parse_topology
from tests.support.fakes import FakeHost

TOPOLOGY = """\
# two NVL72 racks
BlockName=rackA Nodes=gb[01-03]
BlockName=rackB Nodes=gb[04-05],gb07
BlockSizes=3,6
SwitchName=s1 Nodes=gb[01-07]

   # indented comment
"""
KEY_A = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.7"
KEY_B = "11111111-2222-3333-4444-555555555555.7"
KEY_C = "11111111-2222-3333-4444-555555555555.8"


def blocks(**nodes: str) -> BlockMap:
    """A BlockMap from node=block keyword arguments, without keys."""
    return BlockMap("test", nodes, {})


class TestDomainMembers:
    def test_without_a_source_all_nodes_in_order(self) -> None:
        """Without a source every node of the job is a member, in node-list order."""
        assert domain_members(["gb05", "gb01", "gb03"], "gb01", None) == ("gb05", "gb01", "gb03")

    def test_keeps_only_own_block_in_node_list_order(self) -> None:
        """Only the trays in this tray's block are members, in the job's node-list order."""
        source = parse_topology(TOPOLOGY, "topo")
        nodes = ["gb07", "gb02", "gb04", "gb01", "gb05"]
        assert domain_members(nodes, "gb04", source) == ("gb07", "gb04", "gb05")
        assert domain_members(nodes, "gb01", source) == ("gb02", "gb01")

    def test_three_domains_and_a_domain_of_one(self) -> None:
        """A job over three blocks: each tray gets exactly its block's trays; a block with one tray is a domain."""
        source = blocks(a1="A", a2="A", b1="B", b2="B", b3="B", c1="C")
        nodes = ["a1", "b1", "c1", "a2", "b2", "b3"]
        assert {me: domain_members(nodes, me, source) for me in nodes} == {
            "a1": ("a1", "a2"),
            "a2": ("a1", "a2"),
            "b1": ("b1", "b2", "b3"),
            "b2": ("b1", "b2", "b3"),
            "b3": ("b1", "b2", "b3"),
            "c1": ("c1",),
        }

    def test_node_not_in_any_block_is_an_error(self) -> None:
        """A tray that is in no block of the source fails with its name and the source."""
        with pytest.raises(
            ConfigError, match=r"^topo: this node gb06 is in no BlockName= block \(in no NVLink domain\)"
        ):
            domain_members(["gb01", "gb06"], "gb06", parse_topology(TOPOLOGY, "topo"))

    def test_job_node_outside_blocks_is_left_out(self) -> None:
        """A job node that is in no block is simply not a member of this tray's domain."""
        assert domain_members(["gb01", "gb06", "gb02"], "gb01", parse_topology(TOPOLOGY, "t")) == ("gb01", "gb02")


class TestCrossCheck:
    def test_matching_key_passes(self) -> None:
        """A source that gives this tray the key NVML reports lets the prolog go on."""
        cross_check("gb01", KEY_A, [(BlockMap("m", {"gb01": KEY_A}, {KEY_A: KEY_A}), True)])

    def test_mismatch_names_both_keys_the_node_and_the_source(self) -> None:
        """NVML key A against a map that says B: refused, naming node, both keys, the file and the block."""
        source = BlockMap("/etc/slurm/nvlink.map", {"gb01": KEY_B}, {KEY_B: KEY_B})
        with pytest.raises(TopologyMismatch) as info:
            cross_check("gb01", KEY_A, [(source, True)])
        message = str(info.value)
        assert all(part in message for part in ("gb01", KEY_A, KEY_B, "/etc/slurm/nvlink.map", "before starting"))

    def test_block_without_a_key_is_not_checked(self) -> None:
        """A topology.conf block without a key comment has nothing to compare against."""
        cross_check("gb01", KEY_A, [(blocks(gb01="rackA"), False)])

    def test_required_map_must_name_this_node(self) -> None:
        """A map configured for the check that lacks this node is a config error naming the node."""
        with pytest.raises(ConfigError, match="this node gb01 is not in the NVLink domain map"):
            cross_check("gb01", KEY_A, [(BlockMap("m", {"gb02": KEY_A}, {KEY_A: KEY_A}), True)])

    def test_no_nvml_key_skips_the_check(self) -> None:
        """With [policy] fabric = none there is no NVML key: nothing is compared."""
        cross_check("gb01", None, [(BlockMap("m", {"gb01": KEY_B}, {KEY_B: KEY_B}), True)])

    def test_every_source_is_checked(self) -> None:
        """A matching topology file does not hide a map that disagrees."""
        conf = BlockMap("conf", {"gb01": "rackA"}, {"rackA": KEY_A})
        with pytest.raises(TopologyMismatch, match="map puts it in"):
            cross_check("gb01", KEY_A, [(conf, False), (BlockMap("map", {"gb01": KEY_B}, {KEY_B: KEY_B}), True)])


class TestJobDomain:
    @pytest.fixture
    def files(self, root: Path) -> Path:
        etc = root / "etc/slurm"
        etc.mkdir(parents=True)
        (etc / "topology.conf").write_text(TOPOLOGY)
        (etc / "nvlink.map").write_text(
            "".join(f"gb{i:02d} {KEY_A}\n" for i in (1, 2, 3)) + "".join(f"gb{i:02d} {KEY_B}\n" for i in (4, 5, 7))
        )
        return etc

    def test_default_source_is_all_trays(self, make_settings: Callable[..., Any]) -> None:
        """With no topology file ([topology] source = auto -> none), the job's trays are one domain."""
        s = make_settings()
        assert s.topology.source == "none"
        assert job_domain(["gb01", "gb09"], "gb01", s, KEY_A, None) == ("gb01", "gb09")

    def test_map_source_splits_and_logs_once(self, files: Path, make_settings: Callable[..., Any]) -> None:
        """source = map: the trays with this tray's key; a job over two domains logs imex.domain.split once."""
        s = make_settings(node="gb04", paths={"topology_file": "/etc/slurm/nvlink.map"}, topology={"source": "map"})
        log = _Log()
        assert job_domain(["gb01", "gb04", "gb02", "gb05"], "gb04", s, KEY_B, log) == ("gb04", "gb05")
        assert [(e[1], e[2]["domain"], e[2]["trays"], e[2]["domains"]) for e in log.events] == [
            ("imex.domain.split", KEY_B, 2, 2)
        ]

    def test_split_event_names_domain_key_and_counts(self, files: Path, make_settings: Callable[..., Any]) -> None:
        """imex.domain.split carries the domain joined, its key, its trays, the domains and nodes in none."""
        s = make_settings(paths={"topology_file": "/etc/slurm/topology.conf"})
        log = _Log()
        job_domain(["gb01", "gb04", "gb02", "gb06"], "gb01", s, KEY_A, log)
        assert log.events == [
            (
                "info",
                "imex.domain.split",
                {"domain": "rackA", "key": KEY_A, "trays": 2, "domains": 2, "outside": "gb06"},
            )
        ]

    def test_one_domain_logs_nothing(self, files: Path, make_settings: Callable[..., Any]) -> None:
        """A job inside one domain logs no split event."""
        s = make_settings(paths={"topology_file": "/etc/slurm/topology.conf"})
        log = _Log()
        assert job_domain(["gb01", "gb02"], "gb01", s, KEY_A, log) == ("gb01", "gb02")
        assert log.events == []

    def test_topology_conf_with_a_map_for_the_check(self, files: Path, make_settings: Callable[..., Any]) -> None:
        """Blocks from topology.conf, keys from [paths] topology_map: a tray whose NVML key differs is refused."""
        s = make_settings(paths={"topology_file": "/etc/slurm/topology.conf", "topology_map": "/etc/slurm/nvlink.map"})
        assert job_domain(["gb01", "gb02"], "gb01", s, KEY_A, _Log()) == ("gb01", "gb02")
        with pytest.raises(TopologyMismatch, match=f"{KEY_C} .NVML.*nvlink.map puts it in {KEY_A}"):
            job_domain(["gb01", "gb02"], "gb01", s, KEY_C, _Log())

    def test_node_missing_from_the_map_source(self, files: Path, make_settings: Callable[..., Any]) -> None:
        """With source = map, a tray missing from the map fails; a job node missing from it is left out."""
        s = make_settings(node="gb06", paths={"topology_file": "/etc/slurm/nvlink.map"}, topology={"source": "map"})
        with pytest.raises(ConfigError, match="gb06 is in no map line"):
            job_domain(["gb01", "gb06"], "gb06", s, KEY_A, _Log())
        assert job_domain(["gb01", "gb06"], "gb01", s, KEY_A, _Log()) == ("gb01",)


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append((level, event, kw))


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

    def test_names_are_matched_without_regard_to_case(self) -> None:
        """As glibc reads /etc/hosts (strcasecmp): GB01 and gb01 are one name, refused with two addresses."""
        assert parse_hosts_file("10.0.0.1 GB01 Gb01-IB\n10.0.0.1 gb01\n", "h") == {"gb01": "10.0.0.1",
                                                                                   "gb01-ib": "10.0.0.1"}  # fmt: skip
        with pytest.raises(ConfigError, match=r"h:2: GB01 has two addresses \(10.0.0.1, 10.0.0.9\)"):
            parse_hosts_file("10.0.0.1 gb01\n10.0.0.9 GB01\n", "h")

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

    def test_trays_are_found_whatever_the_case(self, tmp_path: Path) -> None:
        """Slurm's GB01 finds the file's gb01 and gb02 the file's GB02, as /etc/hosts would (no 'not in' failure)."""
        (tmp_path / "hosts").write_text("10.1.0.1 gb01\n10.1.0.2 GB02\n")
        got = resolve_all(["GB01", "gb02"], method="hosts_file", host=_host({}), hosts_file=tmp_path / "hosts")
        assert got == ("10.1.0.1", "10.1.0.2")

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


class TestChannelPlace:
    def test_first_tray_of_the_domain_in_its_block_sorted_by_name(self) -> None:
        """The clique is the domain's block, sorted by name whatever the file's order: the domain's earliest tray
        gives its position, the same whichever tray of the domain asks."""
        text = f"BlockName=r1 Nodes=gb03,gb01,gb02  # imexctl-key: {KEY_A}\n"
        source = parse_topology(text + f"BlockName=r2 Nodes=gb[04-05],gb07  # imexctl-key: {KEY_B}\n", "t")
        assert channel_place(("gb07", "gb05"), source, None) == Place(1, 3, "block r2")
        assert channel_place(("gb03",), source, None) == Place(2, 3, "block r1")
        assert channel_place(("gb02", "gb01"), source, ["ignored"]) == Place(0, 3, "block r1")

    def test_blocks_with_one_key_are_one_clique(self) -> None:
        """Two blocks that the source gives one NVML key (a clique split over blocks) are one clique."""
        text = f"BlockName=a Nodes=gb[01-02]  # imexctl-key: {KEY_A}\nBlockName=b Nodes=gb[03-04]  # imexctl-key: {KEY_A}\n"
        text += f"BlockName=c Nodes=gb05  # imexctl-key: {KEY_B}\n"
        source = parse_topology(text, "t")
        assert channel_place(("gb03", "gb04"), source, None) == Place(2, 4, "block b")
        assert channel_place(("gb05",), source, None) == Place(0, 1, "block c")

    def test_keyless_blocks_make_the_whole_file_one_clique(self) -> None:
        """Two blocks without a key may be one NVLink clique split by Slurm's block size: nothing tells, so every
        tray of the file is one clique (each block its own clique gave both blocks' first domains position 0 of 2,
        one number for two domains of one clique)."""
        source = parse_topology("BlockName=b1 Nodes=gb[01-02]\nBlockName=b2 Nodes=gb[03-04]\n", "/etc/t.conf")
        assert channel_place(("gb01", "gb02"), source, None) == Place(0, 4, "every block of /etc/t.conf")
        assert channel_place(("gb03", "gb04"), source, None) == Place(2, 4, "every block of /etc/t.conf")

    def test_one_keyless_block_makes_the_whole_file_one_clique(self) -> None:
        """A keyed block next to a keyless one: the keyless one may share the keyed one's clique, so all is one."""
        source = parse_topology(f"BlockName=b1 Nodes=gb[01-02]  # imexctl-key: {KEY_A}\nBlockName=b2 Nodes=gb03\n", "t")
        assert channel_place(("gb03",), source, None) == Place(2, 3, "every block of t")
        assert keyless_blocks(source) == ["b2"] and largest_clique(source) == 3

    def test_a_topology_map_merges_the_blocks_of_one_key(self) -> None:
        """[paths] topology_map gives keyless blocks their keys: the blocks whose trays share a key are one clique,
        the others apart (as imexctl-key comments would)."""
        source = parse_topology(
            "BlockName=b1 Nodes=gb[01-02]\nBlockName=b2 Nodes=gb[03-04]\nBlockName=c Nodes=gb05\n", "t"
        )
        key_map = parse_map(f"gb01 {KEY_A}\ngb02 {KEY_A}\ngb03 {KEY_A}\ngb04 {KEY_A}\ngb05 {KEY_B}\n", "m")
        assert channel_place(("gb03", "gb04"), source, None, key_map) == Place(2, 4, "block b2")
        assert channel_place(("gb05",), source, None, key_map) == Place(0, 1, "block c")
        assert cliques(source, key_map) == [["gb01", "gb02", "gb03", "gb04"], ["gb05"]]
        assert keyless_blocks(source, key_map) == [] and largest_clique(source, key_map) == 4

    def test_a_map_that_misses_a_tray_leaves_its_block_keyless(self) -> None:
        """A block with a tray the map does not name has no key from the map: the whole file is one clique."""
        source = parse_topology("BlockName=b1 Nodes=gb[01-02]\nBlockName=b2 Nodes=gb[03-04]\n", "t")
        key_map = parse_map(f"gb01 {KEY_A}\ngb02 {KEY_A}\ngb03 {KEY_B}\n", "m")
        assert keyless_blocks(source, key_map) == ["b2"]
        assert channel_place(("gb03", "gb04"), source, None, key_map) == Place(2, 4, "every block of t")

    def test_keys_chain_blocks_into_one_clique(self) -> None:
        """Blocks that share a key through either source are one clique, also through a third block (sources that
        contradict each other, which each tray's NVML cross-check refuses: the numbers stay apart meanwhile)."""
        text = f"BlockName=z Nodes=gb05  # imexctl-key: {KEY_C}\nBlockName=a Nodes=gb01  # imexctl-key: {KEY_A}\n"
        text += f"BlockName=m Nodes=gb03  # imexctl-key: {KEY_B}\n"
        source = parse_topology(text, "t")
        key_map = parse_map(f"gb01 {KEY_A}\ngb03 {KEY_A}\ngb05 {KEY_B}\n", "m")  # m shares A and B: one clique
        assert cliques(source, key_map) == [["gb01", "gb03", "gb05"]]
        assert cliques(source) == [["gb01"], ["gb03"], ["gb05"]]

    def test_a_map_source_is_keyed_by_clique(self) -> None:
        """A NODE KEY map: the clique is every node of the key."""
        source = parse_map(f"gb02 {KEY_A}\ngb01 {KEY_A}\ngb09 {KEY_B}\n", "m")
        assert channel_place(("gb02",), source, None) == Place(1, 2, f"block {KEY_A}")

    def test_without_a_source_the_clique_is_slurm_conf_in_slurms_order(self) -> None:
        """No topology: every node of slurm.conf, in its own order (not sorted)."""
        assert channel_place(("gb01", "gb09"), None, ["cpu1", "gb09", "gb01"]) == Place(1, 3, "slurm.conf")

    @pytest.mark.parametrize(
        ("names", "why"),
        [(None, "no topology source and no slurm.conf"), (["gb01"], "slurm.conf does not list gb02")],
    )
    def test_no_place_is_position_zero_of_one(self, names: list[str] | None, why: str) -> None:
        """No source, and no slurm.conf or one without a tray of the domain: no place (the job-id rule), and why."""
        place = channel_place(("gb01", "gb02"), None, names)
        assert (place.position, place.trays, place.clique) == (0, 1, "none") and why in place.unplaced
