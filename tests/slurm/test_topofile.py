"""topofile: the prolog's NVLink-domain sources (topology.conf, topology.yaml, NODE KEY map) and their keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.platform.errors import ConfigError
from imexctl.slurm.topofile import load, parse_map, parse_topology, parse_yaml

KEY_A = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.7"
KEY_B = "11111111-2222-3333-4444-555555555555.7"

TOPOLOGY = """\
# two NVL72 racks
BlockName=rackA Nodes=gb[01-03]
BlockName=rackB Nodes=gb[04-05],gb07
BlockSizes=3,6
SwitchName=s1 Nodes=gb[01-07]

   # indented comment
"""

# topology.yaml(5)'s EXAMPLE (SchedMD/slurm doc/man/man5/topology.yaml.5, slurm-25-05-0-1), with a key comment
MAN_PAGE_YAML = f"""\
---
- topology: topo1
  cluster_default: true
  tree:
    switches:
      - switch: sw_root
        children: s[1-2]
      - switch: s1
        nodes: node[01-02]
      - switch: s2
        nodes: node[03-04]
- topology: topo2
  cluster_default: false
  block:
    block_sizes:
      - 4
      - 16
    blocks:
      - block: b1  # imexctl-key: {KEY_A}
        nodes: node[01-04]
      - block: b2
        nodes: node[05-08]
      - block: b3
        nodes: node[09-12]
      - block: b4
        nodes: node[13-16]
- topology: topo3
  cluster_default: false
  flat: true
"""


class TestTopologyConf:
    def test_maps_every_node_to_its_block(self) -> None:
        """Each node of a BlockName line maps to that block; other lines add nothing."""
        source = parse_topology(TOPOLOGY, "topo")
        assert source.block_of == {
            "gb01": "rackA",
            "gb02": "rackA",
            "gb03": "rackA",
            "gb04": "rackB",
            "gb05": "rackB",
            "gb07": "rackB",
        }
        assert source.keys == {} and source.key_of("gb01") is None

    def test_ignores_other_lines(self) -> None:
        """SwitchName=, BlockSizes=, comments and blank lines add no node."""
        assert (
            parse_topology("SwitchName=s1 Nodes=gb[01-09]\nBlockSizes=4\n\n# BlockName=x Nodes=gb01\n", "t").block_of
            == {}
        )

    def test_parameter_names_are_case_insensitive(self) -> None:
        """topology.conf(5): parameter names are case insensitive."""
        assert parse_topology("blockname=b1 NODES=gb[01-02]\n", "t").block_of == {"gb01": "b1", "gb02": "b1"}

    def test_key_comment_gives_the_block_its_key(self) -> None:
        """'# imexctl-key: <key>' on a block line is the block's NVML key (canonical, lower case)."""
        source = parse_topology(
            f"BlockName=b1 Nodes=gb01  # imexctl-key: {KEY_A.upper()}\nBlockName=b2 Nodes=gb02\n", "t"
        )
        assert source.keys == {"b1": KEY_A} and source.key_of("gb01") == KEY_A and source.key_of("gb02") is None

    def test_other_comments_are_no_key(self) -> None:
        """A trailing comment without 'imexctl-key:' is just a comment."""
        assert parse_topology("BlockName=b1 Nodes=gb01  # rack 1, row 3\n", "t").keys == {}

    def test_bad_key_comment_is_refused(self) -> None:
        """A malformed key in a key comment is an error (never a silently skipped check)."""
        with pytest.raises(ConfigError, match=r"^t:1: bad imexctl-key: comment: .*not a cluster UUID"):
            parse_topology("BlockName=b1 Nodes=gb01 # imexctl-key: 1234.7\n", "t")

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


class TestMap:
    def test_node_key_lines(self) -> None:
        """Each NODE KEY line puts the node in the domain named by its key; '-' is no domain."""
        source = parse_map(f"# map\ngb01 {KEY_A}\ngb02 {KEY_A}  # rack 1\n\ngb03 {KEY_B}\nlogin1 -\n", "m")
        assert source.block_of == {"gb01": KEY_A, "gb02": KEY_A, "gb03": KEY_B}
        assert source.key_of("gb03") == KEY_B and source.key_of("login1") is None

    def test_clush_prefix_is_dropped(self) -> None:
        """A map collected with clush or pdsh ('host: NODE KEY' lines) reads as the same map."""
        text = f"gb01: gb01 {KEY_A}\ngb02.cluster: gb02 {KEY_A}  # rack 1\ngb03: gb03 {KEY_B}\nlogin1: login1 -\n"
        source = parse_map(text, "m")
        assert source.block_of == {"gb01": KEY_A, "gb02": KEY_A, "gb03": KEY_B}

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param(f"gb01 {KEY_A} extra\n", r"m:1: expected 'NODE KEY'", id="three-fields"),
            pytest.param(f"gb01: gb01 {KEY_A} extra\n", r"m:1: expected 'NODE KEY'", id="prefix-three-fields"),
            pytest.param(f": gb01 {KEY_A}\n", r"m:1: expected 'NODE KEY'", id="bare-colon"),
            pytest.param("gb01\n", r"m:1: expected 'NODE KEY'", id="one-field"),
            pytest.param(f"gb[01-02] {KEY_A}\n", r"m:1: expected 'NODE KEY'", id="hostlist"),
            pytest.param("gb01 nokey\n", r"m:1: node gb01: 'nokey' is not <clusterUuid>.<cliqueId>", id="bad-key"),
            pytest.param(f"gb01 {KEY_A}\ngb01 {KEY_A}\n", r"m:2: node gb01 is listed twice", id="twice"),
            pytest.param(f"gb01 -\ngb01 {KEY_A}\n", r"m:2: node gb01 is listed twice", id="twice-dash"),
        ],
    )
    def test_malformed_lines_are_refused(self, text: str, match: str) -> None:
        """Anything but NODE KEY, a bad key and a node listed twice are errors naming line and node."""
        with pytest.raises(ConfigError, match=f"^{match}"):
            parse_map(text, "m")


class TestYaml:
    def test_man_page_example(self) -> None:
        """The man page's example: the only block topology's blocks; tree and flat topologies ignored."""
        source = parse_yaml(MAN_PAGE_YAML, "topology.yaml")
        assert source.block_of == {f"node{i:02d}": f"b{(i - 1) // 4 + 1}" for i in range(1, 17)}
        assert source.keys == {"b1": KEY_A}

    def test_named_topology_and_flow_lists_and_quotes(self) -> None:
        """yaml_topology picks one of several block topologies; [a, b] lists and quoted values are read."""
        text = (
            "- topology: racks\n  block:\n    block_sizes: [18, 36]\n    blocks:\n"
            "    - block: 'r1'\n      nodes: \"gb[01-02]\"\n    -   block: r2\n        nodes: gb03\n"
            "- topology: pairs\n  block:\n    blocks:\n      - {block: p1}\n"
        )
        with pytest.raises(ConfigError, match=r"^y:12: YAML that imexctl does not read .*\{block: p1\}"):
            parse_yaml(text, "y")  # a flow mapping
        text = text.replace("{block: p1}", "block: p1")
        with pytest.raises(ConfigError, match="set .topology. yaml_topology: 2 block topologies .racks, pairs."):
            parse_yaml(text, "y")
        source = parse_yaml(text, "y", "racks")
        assert source.block_of == {"gb01": "r1", "gb02": "r1", "gb03": "r2"}
        assert parse_yaml(text, "y", "pairs").block_of == {}

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param("- topology: t\n  block:\n\tblocks: []\n", "y:3: a tab", id="tab"),
            pytest.param("- topology: t\n  block: &a\n", "y:2: YAML that imexctl does not read", id="anchor"),
            pytest.param("- topology: t\n  flat: true\n", "y: set .topology. yaml_topology: 0 block", id="no-block"),
            pytest.param("topology: t\n", "y: expected a list of topologies", id="not-a-list"),
            pytest.param("- topology: t\n  topology: u\n", "y:2: key 'topology' given twice", id="dup-key"),
            pytest.param(
                "- topology: t\n  block:\n    blocks: x\n", "y:2: the block topology has no 'blocks:'", id="no-list"
            ),
            pytest.param(
                "- topology: t\n  block:\n    blocks:\n      - block: b\n        nodes:\n          - gb01\n",
                "y:4: 'block' and 'nodes' must be one name and one host list",
                id="nodes-list",
            ),
            pytest.param(
                "- topology: t\n  block:\n    blocks:\n      - block: b\n        nodes: gb01\n       junk\n",
                "y:6: expected 'key: value'",
                id="bad-indent",
            ),
            pytest.param(
                "- topology: t\n  block:\n    blocks:\n      - block: a\n        nodes: gb01\n"
                "      - block: b\n        nodes: gb[01-02]\n",
                "y:6: node gb01 is in blocks a and b",
                id="two-blocks",
            ),
            pytest.param('- topology: "t\n', "y:1: unterminated quoted string", id="quote"),
        ],
    )
    def test_refusals_name_the_line(self, text: str, match: str) -> None:
        """YAML beyond the subset, a missing block topology or a node in two blocks: an error with the line."""
        with pytest.raises(ConfigError, match=f"^{match}"):
            parse_yaml(text, "y")

    def test_wanted_topology_must_be_a_block_topology(self) -> None:
        """Naming a tree or missing topology in yaml_topology is an error saying which."""
        with pytest.raises(ConfigError, match="topology 'topo1' is not a block topology"):
            parse_yaml(MAN_PAGE_YAML, "y", "topo1")
        with pytest.raises(ConfigError, match="topology 'nope' is not there .topologies: topo1, topo2, topo3."):
            parse_yaml(MAN_PAGE_YAML, "y", "nope")


class TestLoad:
    def test_reads_each_kind(self, tmp_path: Path) -> None:
        """load() reads the file and parses it as the configured kind."""
        (tmp_path / "t.conf").write_text(TOPOLOGY)
        (tmp_path / "t.yaml").write_text(MAN_PAGE_YAML)
        (tmp_path / "t.map").write_text(f"gb01 {KEY_A}\n")
        assert load("topology_conf", tmp_path / "t.conf").block_of["gb07"] == "rackB"
        assert load("topology_yaml", tmp_path / "t.yaml").block_of["node16"] == "b4"
        assert load("map", tmp_path / "t.map").key_of("gb01") == KEY_A

    def test_missing_file_is_a_config_error(self, tmp_path: Path) -> None:
        """A configured source that does not exist is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="topology file .*nope"):
            load("topology_conf", tmp_path / "nope")

    def test_symlinked_file_is_refused(self, tmp_path: Path) -> None:
        """A source that is a symlink is not followed."""
        (tmp_path / "t.conf").write_text(TOPOLOGY)
        (tmp_path / "link").symlink_to(tmp_path / "t.conf")
        with pytest.raises(ConfigError, match="cannot read topology file"):
            load("topology_conf", tmp_path / "link")
