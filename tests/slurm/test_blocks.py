"""blocks: ``imexctl topology blocks`` turns many trays' reports into Slurm blocks, a yaml topology or a map."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imexctl.cli import main
from imexctl.platform.errors import ReportError
from imexctl.slurm import blocks
from imexctl.slurm.topofile import parse_map, parse_topology, parse_yaml
from tests.support.ci import unavailable

KEY_A = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.7"
KEY_B = "11111111-2222-3333-4444-555555555555.7"
KEY_C = "11111111-2222-3333-4444-555555555555.32766"
KEY_A2 = "4f2a9c1e-0000-4000-8000-000000000001.7"  # same first 8 hex digits and clique as KEY_A
SCONTROL = Path("/usr/bin/scontrol")


def envelope(node: str, key: str | None = None, *, error: str = "", reason: str = "") -> str:
    """One line as 'imexctl topology --json' prints it."""
    fabric = "error" if error else "nvlink" if key else "none"
    data = {"node": node, "fabric": fabric, "key": key, "reason": reason, "error": error, "health": "", "gpus": []}
    status = "error" if error else "ok"
    errors = [{"code": "gpu_failed", "message": error}] if error else []
    out = {"imexctl_result_version": "1", "status": status, "exit_code": 69 if error else 0, "data": data}
    return json.dumps({**out, "errors": errors})


def run_blocks(*argv: str, stdin: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["topology", "blocks", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# a cluster: rack A with names in Slurm's padded form, rack B whose names cross a width (n9, n10) and
# include names outside any folded form, a one-tray rack C, and nodes without fabric
CLUSTER = {
    **{f"gb{i:02d}": KEY_A for i in range(1, 19)},
    **{f"n{i}": KEY_B for i in range(7, 12)},
    "gpu-x": KEY_B,
    "n08-ib": KEY_B,
    "n08": KEY_B,  # beside n8: a padded and an unpadded name in one rack
    "solo": KEY_C,
}
NO_FABRIC = ["login1", "login2", "cpu007"]


def cluster_lines(order: int = 0) -> list[str]:
    lines = [f"{n} {k}" for n, k in CLUSTER.items()] + [f"{n}: {envelope(n, reason='no GPU')}" for n in NO_FABRIC]
    random.Random(order).shuffle(lines)
    return lines


class TestParseLine:
    def test_node_key(self) -> None:
        """'NODE KEY' is a report; the key is made canonical (lower case)."""
        report = blocks.parse_line(f"  gb01   {KEY_A.upper()}  ", "f:1")
        assert report == blocks.Report("gb01", KEY_A, "", "", "f:1")

    @pytest.mark.parametrize("prefix", ["gb01: ", "gb01.cluster: ", "other: "], ids=["clush", "fqdn", "any-host"])
    def test_node_key_behind_a_prefix(self, prefix: str) -> None:
        """'host: NODE KEY', as clush or pdsh print a node's 'NODE KEY' line: the node is the line's own."""
        report = blocks.parse_line(f"{prefix}gb01 {KEY_A}", "f:1")
        assert report == blocks.Report("gb01", KEY_A, "", "", "f:1")

    def test_dash_is_no_fabric(self) -> None:
        """'NODE -' says the node has no multi-node NVLink fabric."""
        report = blocks.parse_line("login1 -", "f:1")
        assert report is not None and (report.node, report.key, report.error) == ("login1", None, "")

    @pytest.mark.parametrize(
        "prefix", ["", "gb01: ", "0: ", "gb01.cluster:"], ids=["bare", "clush", "srun-label", "fqdn"]
    )
    def test_json_behind_a_prefix(self, prefix: str) -> None:
        """The JSON object, bare or behind the 'host: ' prefix of clush/pdsh or srun --label; the node is its own."""
        report = blocks.parse_line(prefix + envelope("gb01", KEY_A), "f:1")
        assert report == blocks.Report("gb01", KEY_A, "", "", "f:1")

    def test_json_without_fabric_and_with_an_error(self) -> None:
        """A report of no fabric keeps its reason; one of a failed NVML read keeps the error."""
        none = blocks.parse_line(envelope("cpu1", reason="NVML reports no GPU"), "f:1")
        failed = blocks.parse_line(envelope("gb05", error="NVML init failed"), "f:2")
        assert none is not None and (none.key, none.reason, none.error) == (None, "NVML reports no GPU", "")
        assert failed is not None and (failed.key, failed.error) == (None, "NVML init failed")

    @pytest.mark.parametrize("line", ["", "   ", "# gb01 x"])
    def test_blank_and_comment_lines(self, line: str) -> None:
        """Blank and '#' lines are no report."""
        assert blocks.parse_line(line, "f:1") is None

    @pytest.mark.parametrize(
        ("line", "match"),
        [
            pytest.param("gb01", r"f:3: malformed line", id="one-field"),
            pytest.param(f"gb01 {KEY_A} x", r"f:3: malformed line", id="three-fields"),
            pytest.param("gb01 4f2a9c1e.7", r"f:3: node gb01: bad NVLink domain key: '4f2a9c1e' is not", id="bad-uuid"),
            pytest.param(f"gb01 {KEY_A}0000000000", r"f:3: node gb01: bad NVLink domain key: clique id", id="clique"),
            pytest.param(
                "gb01 00000000-0000-0000-0000-000000000000.7", r"f:3: node gb01: .*all-zero cluster UUID", id="zero"
            ),
            pytest.param(f"gb[01-02] {KEY_A}", r"f:3: bad node name 'gb\[01-02\]'", id="hostlist-name"),
            pytest.param("gb01: {not json", r"f:3: not an 'imexctl topology --json' object", id="bad-json"),
            pytest.param('{"data": {"fabric": "none"}}', r"f:3: not an 'imexctl topology --json' object", id="no-node"),
            pytest.param(
                '{"data": {"node": "gb01", "fabric": "maybe"}}', r"f:3: node gb01: unknown fabric 'maybe'", id="fabric"
            ),
            pytest.param(
                '{"data": {"node": "gb01", "fabric": "nvlink", "key": null}}', r"f:3: node gb01: bad NVLink", id="null"
            ),
        ],
    )
    def test_malformed_lines_are_refused(self, line: str, match: str) -> None:
        """A line that is neither form, or has a bad node or key, is refused naming the place and the node."""
        with pytest.raises(ReportError, match=f"^{match}"):
            blocks.parse_line(line, "f:3")


class TestCollect:
    def test_same_node_twice_with_one_key_is_fine(self) -> None:
        """A node reported twice with the same answer (two collection runs) counts once."""
        got = blocks.collect([blocks.Report("gb01", KEY_A, "", "", "f:1"), blocks.Report("gb01", KEY_A, "", "", "g:9")])
        assert got.keys == {"gb01": KEY_A}

    @pytest.mark.parametrize(
        "second",
        [
            pytest.param(blocks.Report("gb01", KEY_B, "", "", "g:9"), id="two-keys"),
            pytest.param(blocks.Report("gb01", None, "no GPU", "", "g:9"), id="key-then-none"),
            pytest.param(blocks.Report("gb01", None, "", "NVML init failed", "g:9"), id="key-then-error"),
        ],
    )
    def test_node_twice_with_different_answers_is_refused(self, second: blocks.Report) -> None:
        """A node reported twice with different answers is refused, naming the node, both answers and places."""
        with pytest.raises(ReportError) as info:
            blocks.collect([blocks.Report("gb01", KEY_A, "", "", "f:1"), second])
        message = str(info.value)
        assert message.startswith("g:9: node gb01 reported twice with different keys")
        assert KEY_A in message and "f:1" in message and (second.key or "no ") in message

    def test_sorts_nodes_into_keys_no_fabric_and_failed(self) -> None:
        """Every node lands in exactly one of keys, no_fabric and failed."""
        got = blocks.collect(
            [
                blocks.Report("gb01", KEY_A, "", "", "f:1"),
                blocks.Report("cpu1", None, "no GPU", "", "f:2"),
                blocks.Report("gb05", None, "", "NVML init failed", "f:3"),
            ]
        )
        assert (got.keys, got.no_fabric, got.failed) == (
            {"gb01": KEY_A},
            {"cpu1": "no GPU"},
            {"gb05": "NVML init failed"},
        )


class TestNames:
    def test_name_comes_from_the_key(self) -> None:
        """nvl-<first 8 hex digits of the cluster UUID>-<clique id>."""
        assert blocks.block_names([KEY_A, KEY_C]) == {KEY_A: "nvl-4f2a9c1e-7", KEY_C: "nvl-11111111-32766"}

    def test_clash_uses_the_whole_uuid(self) -> None:
        """Two keys whose short names clash both get the whole UUID; others keep the short name."""
        names = blocks.block_names([KEY_A, KEY_A2, KEY_B])
        assert names == {
            KEY_A: "nvl-4f2a9c1e5d6b4e8f9a0b1c2d3e4f5a6b-7",
            KEY_A2: "nvl-4f2a9c1e000040008000000000000001-7",
            KEY_B: "nvl-11111111-7",
        }

    def test_natural_order(self) -> None:
        """Digit runs sort as numbers, so n9 comes before n10."""
        assert sorted(["n10", "n9", "gb02", "gb1", "n08-ib"], key=blocks.natural) == [
            "gb1",
            "gb02",
            "n08-ib",
            "n9",
            "n10",
        ]


class TestBlockSizes:
    @pytest.mark.parametrize(("text", "sizes"), [("18", (18,)), ("18,36,144", (18, 36, 144)), ("1,32768", (1, 32768))])
    def test_valid(self, text: str, sizes: tuple[int, ...]) -> None:
        """Increasing sizes, each a power-of-two multiple of the first (block_record.c's rule)."""
        assert blocks.parse_block_sizes(text) == sizes

    @pytest.mark.parametrize("text", ["", "x", "0", "-4", "18,27", "18,18", "36,18", "18,54", "1,65536"])
    def test_invalid(self, text: str) -> None:
        """Anything slurmctld would reject as 'Invalid BlockSizes value' is refused here."""
        with pytest.raises(ValueError, match="block sizes must be|comma-separated"):
            blocks.parse_block_sizes(text)

    def test_blocks_smaller_than_the_base_are_warned_about(self) -> None:
        """A block below the base block size is fine for 25.05+, fatal before: a warning says so."""
        found = [blocks.Block("a", KEY_A, ("a1", "a2")), blocks.Block("b", KEY_B, ("b1",))]
        warning = (
            "block b has 1 node(s), fewer than the first BlockSizes value, 2: "
            "Slurm 25.05 and later accept this, slurmctld before 25.05 refuses to start"
        )
        assert blocks.size_warnings(found, (2,)) == [warning]
        assert "fewer than the first block (a), 2" in blocks.size_warnings(found, ())[0]
        assert blocks.size_warnings(found[::-1], ()) == []


def _reports(lines: list[str]) -> blocks.Collected:
    return blocks.collect(r for i, line in enumerate(lines) if (r := blocks.parse_line(line, f"in:{i}")) is not None)


class TestRender:
    def test_conf_is_the_same_whatever_the_input_order(self) -> None:
        """Shuffled reports give byte-identical output: names from keys, blocks and nodes sorted."""
        outputs = set()
        for seed in range(5):
            got = _reports(cluster_lines(seed))
            outputs.add(blocks.render_conf(blocks.group(got), got) + blocks.render_yaml(blocks.group(got), got))
        assert len(outputs) == 1

    def test_conf_three_domains(self) -> None:
        """One BlockName per domain, folded node lists, the key as a comment, BlockSizes when asked."""
        got = _reports(cluster_lines())
        text = blocks.render_conf(blocks.group(got), got, (1, 2))
        assert text.splitlines() == [
            "# 3 NVLink domain(s), 27 node(s); generated by imexctl topology blocks",
            f"BlockName=nvl-4f2a9c1e-7 Nodes=gb[01-18]  # imexctl-key: {KEY_A}",
            f"BlockName=nvl-11111111-7 Nodes=gpu-x,n[7,08,8],n08-ib,n[9-11]  # imexctl-key: {KEY_B}",
            f"BlockName=nvl-11111111-32766 Nodes=solo  # imexctl-key: {KEY_C}",
            "BlockSizes=1,2",
            "# no multi-node NVLink fabric (in no block): cpu007,login[1-2]",
        ]

    def test_conf_reads_back_as_the_same_partition_with_keys(self) -> None:
        """The prolog's topology.conf reader gets every node's domain and key back from the output."""
        got = _reports(cluster_lines())
        source = parse_topology(blocks.render_conf(blocks.group(got), got), "out")
        assert {n: source.key_of(n) for n in source.block_of} == CLUSTER

    def test_yaml_reads_back_as_the_same_partition_with_keys(self) -> None:
        """The prolog's topology.yaml reader gets every node's domain and key back from --yaml output."""
        got = _reports(cluster_lines())
        text = blocks.render_yaml(blocks.group(got), got, (1, 2), "nvl72")
        source = parse_yaml(text, "out")
        assert {n: source.key_of(n) for n in source.block_of} == CLUSTER
        assert "- topology: nvl72\n  cluster_default: true\n  block:\n    block_sizes: [1, 2]\n    blocks:\n" in text

    def test_yaml_quotes_what_yaml_would_misread(self) -> None:
        """A node list YAML would read as a boolean, null or number is double-quoted."""
        got = blocks.collect([blocks.Report(n, KEY_A, "", "", "x") for n in ("yes",)])
        assert '        nodes: "yes"' in blocks.render_yaml(blocks.group(got), got)
        got = blocks.collect([blocks.Report("007", KEY_A, "", "", "x")])
        assert '        nodes: "007"' in blocks.render_yaml(blocks.group(got), got)

    def test_map_reads_back(self) -> None:
        """--map gives every node with a key, in natural order; the map reader agrees."""
        got = _reports(cluster_lines())
        text = blocks.render_map(got)
        assert text.splitlines()[1:4] == [f"gb01 {KEY_A}", f"gb02 {KEY_A}", f"gb03 {KEY_A}"]
        assert dict(parse_map(text, "out").block_of) == CLUSTER


def _python_with_yaml() -> str | None:
    for candidate in (shutil.which("python3"), "/usr/bin/python3"):
        if (
            candidate
            and subprocess.run([candidate, "-c", "import yaml"], capture_output=True, check=False).returncode == 0
        ):
            return candidate
    return None


def test_yaml_output_is_yaml_as_pyyaml_reads_it() -> None:
    """Where PyYAML exists, it reads --yaml output as topology.yaml(5)'s structure with our blocks."""
    python = _python_with_yaml()
    if python is None:
        pytest.skip("no python3 with PyYAML on this machine")
    got = _reports(cluster_lines())
    text = blocks.render_yaml(blocks.group(got), got, (1, 2))
    done = subprocess.run(
        [python, "-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    (topology,) = json.loads(done.stdout)
    assert topology["topology"] == "nvlink" and topology["cluster_default"] is True
    assert topology["block"]["block_sizes"] == [1, 2]
    assert [(b["block"], b["nodes"]) for b in topology["block"]["blocks"]] == [
        ("nvl-4f2a9c1e-7", "gb[01-18]"),
        ("nvl-11111111-7", "gpu-x,n[7,08,8],n08-ib,n[9-11]"),
        ("nvl-11111111-32766", "solo"),
    ]


class TestCommand:
    def test_stdin_to_topology_conf_and_notes_on_stderr(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reports on stdin give topology.conf on stdout; nodes without fabric are named on stderr; exit 0."""
        code, out, err = run_blocks(stdin="\n".join(cluster_lines()), capsys=capsys, monkeypatch=monkeypatch)
        assert code == 0 and out.startswith("# 3 NVLink domain(s)") and "BlockSizes" not in out
        tail = (
            "fewer than the first block (nvl-4f2a9c1e-7), 18: Slurm 25.05 and later accept this, "
            "slurmctld before 25.05 refuses to start"
        )
        assert err.splitlines() == [
            f"imexctl topology blocks: block nvl-11111111-7 has 8 node(s), {tail}",
            f"imexctl topology blocks: block nvl-11111111-32766 has 1 node(s), {tail}",
            "imexctl topology blocks: 3 node(s) without multi-node NVLink fabric, in no block: cpu007,login[1-2]",
        ]

    def test_files_yaml_and_map(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Several files (and '-' for stdin) are read in turn; --yaml and --map choose the form."""
        lines = cluster_lines()
        (tmp_path / "a").write_text("\n".join(lines[:10]))
        code, out, _ = run_blocks(
            "--yaml", str(tmp_path / "a"), "-", stdin="\n".join(lines[10:]), capsys=capsys, monkeypatch=monkeypatch
        )
        assert code == 0 and {n: parse_yaml(out, "o").key_of(n) for n in CLUSTER} == CLUSTER
        code, out, _ = run_blocks(
            "--map", str(tmp_path / "a"), "-", stdin="\n".join(lines[10:]), capsys=capsys, monkeypatch=monkeypatch
        )
        assert code == 0 and parse_map(out, "o").block_of == CLUSTER

    def test_failed_nodes_exit_69_after_printing(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A report of a failed NVML read: the config is still printed, the node named on stderr, exit 69."""
        stdin = f"gb01 {KEY_A}\ngb02: {envelope('gb02', error='NVML init failed: no driver')}\n"
        code, out, err = run_blocks(stdin=stdin, capsys=capsys, monkeypatch=monkeypatch)
        assert code == 69 and "Nodes=gb01 " in out and "# no answer (NVML failed; in no block): gb02" in out
        assert "imexctl topology blocks: gb02: no answer, in no block: NVML init failed: no driver\n" in err

    def test_malformed_line_exits_65_naming_file_line_and_node(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bad line: nothing on stdout, exit 65, the file, line and node in the error."""
        (tmp_path / "r").write_text(f"gb01 {KEY_A}\ngb02 nope\n")
        code, out, err = run_blocks(str(tmp_path / "r"), stdin="", capsys=capsys, monkeypatch=monkeypatch)
        assert code == 65 and out == ""
        assert "report_invalid" in err and f"{tmp_path}/r:2: node gb02: bad NVLink domain key" in err

    def test_unreadable_file_exits_65(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A file that cannot be read is named."""
        code, _, err = run_blocks(str(tmp_path / "nope"), stdin="", capsys=capsys, monkeypatch=monkeypatch)
        assert code == 65 and f"cannot read {tmp_path}/nope" in err

    def test_empty_input_exits_65(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        """No report at all (only comments) is refused: a topology without blocks is useless."""
        code, out, err = run_blocks(stdin="# nothing\n\n", capsys=capsys, monkeypatch=monkeypatch)
        assert code == 65 and out == "" and "no reports in the input" in err

    def test_no_fabric_anywhere_warns(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reports without any fabric: the output lists them, stderr says there is no block."""
        code, out, err = run_blocks(stdin="cpu1 -\ncpu2 -\n", capsys=capsys, monkeypatch=monkeypatch)
        assert code == 0 and "BlockName" not in out and "in no block): cpu[1-2]" in out
        assert "no node reported a multi-node NVLink fabric: the output has no block" in err

    def test_bad_block_sizes_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """--block-sizes that slurmctld would refuse is a usage error (64) naming the value."""
        with pytest.raises(SystemExit) as info:
            run_blocks("--block-sizes", "18,27", stdin="", capsys=capsys, monkeypatch=monkeypatch)
        assert info.value.code == 64 and "27: block sizes must be" in capsys.readouterr().err


def _expand_with_imexctl(expr: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["hostlist", "expand", expr]) == 0
    return capsys.readouterr().out.split()


def _expand_with_scontrol(expr: str, tmp_path: Path) -> list[str]:
    conf = tmp_path / "slurm.conf"  # scontrol loads a config even for 'show hostnames'
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)}
    done = subprocess.run(
        [str(SCONTROL), "show", "hostnames", expr], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.split()


@pytest.mark.parametrize("expander", ["imexctl", "scontrol"])
def test_blocks_expand_back_to_an_exact_partition(
    expander: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every Nodes= list, expanded by imexctl or by Slurm's own scontrol, gives back exactly its domain's nodes."""
    if expander == "scontrol" and not os.access(SCONTROL, os.X_OK):
        unavailable("/usr/bin/scontrol is not installed (Debian's slurm-client; bash .ci/setup test installs it)")
    got = _reports(cluster_lines())
    text = blocks.render_conf(blocks.group(got), got)
    seen: list[str] = []
    for line in text.splitlines():
        if not line.startswith("BlockName="):
            continue
        expr = line.split()[1].removeprefix("Nodes=")
        names = _expand_with_imexctl(expr, capsys) if expander == "imexctl" else _expand_with_scontrol(expr, tmp_path)
        keys = {CLUSTER[n] for n in names}
        assert len(keys) == 1, f"{expr}: nodes of several domains"
        seen += names
    assert sorted(seen) == sorted(CLUSTER) and len(seen) == len(set(seen))


# ---------------------------------------------------------------- the site's block names

RACKS = {**{f"gb200-r01-t{i:02d}": KEY_A for i in range(1, 19)}, **{f"gb200-r02-t{i:02d}": KEY_B for i in range(1, 19)}}


def rack_blocks() -> list[blocks.Block]:
    return blocks.group(blocks.collect(blocks.Report(n, k, "", "", "f:1") for n, k in RACKS.items()))


class TestSiteNames:
    def test_names_from_the_keys_by_default(self) -> None:
        """Without a map or a pattern the names come from the keys, as before."""
        assert [b.name for b in rack_blocks()] == ["nvl-4f2a9c1e-7", "nvl-11111111-7"]

    def test_pattern_names_each_block_by_its_nodes(self) -> None:
        """--name-pattern: the one group of the pattern over every node name of the block."""
        names = blocks.BlockNames({}, {}, pattern=blocks.parse_pattern(r"gb200-(r\d+)-t\d+"))
        named = blocks.name_blocks(rack_blocks(), names)
        assert [(b.name, b.key, b.nodes[0]) for b in named] == [
            ("r01", KEY_A, "gb200-r01-t01"),
            ("r02", KEY_B, "gb200-r02-t01"),
        ]

    def test_map_by_nodes_and_by_key(self) -> None:
        """--names: 'NAME NODES' names the block holding those trays, 'NAME KEY' the domain of that key."""
        names = blocks.parse_names(f"# racks\nrow1-a gb200-r01-t[01-18]\nrow1-b {KEY_B}  # by key\n", "names")
        assert [b.name for b in blocks.name_blocks(rack_blocks(), names)] == ["row1-a", "row1-b"]

    def test_map_first_then_the_pattern_then_the_key(self) -> None:
        """A block the map does not name takes the pattern's name; one neither names keeps its own."""
        names = blocks.parse_names("first gb200-r01-t01\n", "names")._replace(pattern=re.compile(r"x(\d+)"))
        with pytest.raises(ReportError, match="--name-pattern 'x"):
            blocks.name_blocks(rack_blocks(), names)
        names = names._replace(pattern=None)
        assert [b.name for b in blocks.name_blocks(rack_blocks(), names)] == ["first", "nvl-11111111-7"]

    def test_map_that_splits_a_domain_is_refused(self) -> None:
        """A tray the inventory puts in another rack than NVML does is named, not silently renamed."""
        names = blocks.parse_names("r01 gb200-r01-t[01-17]\nr02 gb200-r01-t18,gb200-r02-t[01-18]\n", "inv")
        with pytest.raises(ReportError, match=r"inv names its trays r01, r02: gb200-r01-t\[01-17\] as r01; "
                                              r"gb200-r01-t18 as r02"):  # fmt: skip
            blocks.name_blocks(rack_blocks(), names)

    def test_one_name_for_two_domains_is_refused(self) -> None:
        """Two NVLink domains never share a block name (they would be one block to Slurm)."""
        names = blocks.BlockNames({}, {}, pattern=blocks.parse_pattern(r"(gb200)-r\d+-t\d+"))
        with pytest.raises(ReportError, match="would both be named gb200"):
            blocks.name_blocks(rack_blocks(), names)

    def test_pattern_that_gives_a_block_two_names_is_refused(self) -> None:
        """Every node of one block must give the same name."""
        names = blocks.BlockNames({}, {}, pattern=blocks.parse_pattern(r"gb200-r\d+-t(\d+)"))
        with pytest.raises(ReportError, match="its trays give 01, 02"):
            blocks.name_blocks(rack_blocks(), names)

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param("r01\n", "names:1: expected 'NAME KEY' or 'NAME NODES'", id="one-field"),
            pytest.param("r 01 gb01\n", "names:1: expected", id="three-fields"),
            pytest.param("r/1 gb01\n", "names:1: block name 'r/1' is not a word", id="bad-name"),
            pytest.param(
                "r1 gb[01-\n", "names:1: 'gb\\[01-' is neither an NVLink domain key nor a host list", id="list"
            ),
            pytest.param("r1 gb01\nr2 gb[01-02]\n", "names:2: node gb01 is named both r1 and r2", id="node-twice"),
            pytest.param(f"r1 {KEY_A}\nr2 {KEY_A}\n", f"names:2: key {KEY_A} is named both", id="key-twice"),
        ],
    )
    def test_bad_maps_are_refused(self, text: str, match: str) -> None:
        """A map line that is not 'NAME KEY' or 'NAME NODES', or that names something twice, names its line."""
        with pytest.raises(ReportError, match=match):
            blocks.parse_names(text, "names")

    @pytest.mark.parametrize(
        ("text", "match"),
        [("(", "is not a regular expression"), ("gb200-r\\d+", "it has 0"), ("(a)(b)", "it has 2")],
    )
    def test_pattern_needs_one_group(self, text: str, match: str) -> None:
        """A pattern that does not compile or has not exactly one group is refused."""
        with pytest.raises(ValueError, match=match):
            blocks.parse_pattern(text)

    def test_command_names_blocks_in_conf_and_yaml(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """imexctl topology blocks --name-pattern / --names: topology.conf and topology.yaml carry the site's names,
        and read back as the same partition with the keys."""
        stdin = "".join(f"{n}: {n} {k}\n" for n, k in RACKS.items())  # clush's prefix on 'NODE KEY' lines
        code, out, err = run_blocks(
            "--name-pattern", r"gb200-(r\d+)-t\d+", "--block-sizes", "18", stdin=stdin, capsys=capsys,
            monkeypatch=monkeypatch,
        )  # fmt: skip
        assert (code, err) == (0, "")
        assert out.splitlines()[1:3] == [
            f"BlockName=r01 Nodes=gb200-r01-t[01-18]  # imexctl-key: {KEY_A}",
            f"BlockName=r02 Nodes=gb200-r02-t[01-18]  # imexctl-key: {KEY_B}",
        ]
        source = parse_topology(out, "o")
        assert source.block_of["gb200-r02-t07"] == "r02" and source.key_of("gb200-r02-t07") == KEY_B
        (tmp_path / "names").write_text(f"r01 gb200-r01-t[01-18]\nr02 {KEY_B}\n")
        code, out, _ = run_blocks("--yaml", "--names", str(tmp_path / "names"), stdin=stdin, capsys=capsys,
                                  monkeypatch=monkeypatch)  # fmt: skip
        assert code == 0 and set(parse_yaml(out, "o").block_of.values()) == {"r01", "r02"}

    def test_command_refuses_a_bad_pattern_and_a_map_that_splits_a_domain(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A pattern without a group is a usage error (64); a map at odds with NVML exits 65, nothing printed."""
        stdin = "".join(f"{n} {k}\n" for n, k in RACKS.items())
        with pytest.raises(SystemExit) as exc:
            run_blocks("--name-pattern", "gb200", stdin=stdin, capsys=capsys, monkeypatch=monkeypatch)
        assert exc.value.code == 64 and "must have exactly one group" in capsys.readouterr().err
        (tmp_path / "names").write_text("r01 gb200-r01-t[01-18],gb200-r02-t01\n")
        code, out, err = run_blocks("--names", str(tmp_path / "names"), stdin=stdin, capsys=capsys,
                                    monkeypatch=monkeypatch)  # fmt: skip
        assert (code, out) == (65, "") and err.startswith("imexctl topology blocks: blocks ")
        assert "would both be named r01" in err and err.endswith("(report_invalid, exit 65)\n")
