"""Tests for the simulator's output formats, config and fault parsing, checked against real samples.

Snapshots here are written out by hand from each sample's content (never via
imexctl's parser), so the formatter and the parser are held to the same
samples independently and cannot drift together.
"""

from __future__ import annotations

import calendar
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.imex.ctl import parse_domain_json
from imexctl.sim import ctl
from imexctl.sim.config import SimConfigError, node_map_key, parse_config_text, parse_nodes_text
from imexctl.sim.faults import FaultError, Faults, parse_faults
from imexctl.sim.formats import (
    LEGEND,
    STATUS_LETTERS,
    domain_state,
    format_json,
    format_text,
    format_timestamp,
    node_entry,
    unavailable_snapshot,
)
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


def _conns(hosts: list[str], statuses: list[str]) -> dict[str, Any]:
    return {str(j): {"host": h, "status": s, "changed": True} for j, (h, s) in enumerate(zip(hosts, statuses))}


def _aws_snapshot() -> dict[str, Any]:
    """The 18-node 570.172 sample, written out as a snapshot."""
    conns = _conns(AWS_HOSTS, ["CONNECTED"] * 18)
    nodes = {str(i): node_entry(h, "READY", "570.172", "", conns) for i, h in enumerate(AWS_HOSTS)}
    return {"nodes": nodes, "timestamp": "5/4/2026 06:08:10.580", "status": "UP"}


def _isv_snapshot() -> dict[str, Any]:
    """The ISV-suite facts (one READY node, one UNAVAILABLE peer), as a snapshot."""
    hosts = ["10.0.0.1", "10.0.0.2"]
    nodes = {
        "0": node_entry("10.0.0.1", "READY", "580.95.05", "gpu-node-1", _conns(hosts, ["CONNECTED"] * 2)),
        "1": node_entry("10.0.0.2", "UNAVAILABLE", "", "", _conns(hosts, ["INVALID"] * 2)),
    }
    return {"nodes": nodes, "timestamp": "9/4/2026 00:37:39.905", "status": "DEGRADED"}


class TestFormatText:
    def test_aws_18_nodes_byte_for_byte(self) -> None:
        """The 18-node snapshot renders exactly as the published 570.172 output."""
        assert _read("imexctl_N_570.172_18nodes.txt") == format_text(_aws_snapshot())

    def test_matches_elided_sample_head(self) -> None:
        """Legend, timestamp and the first node lines equal the published sample (design.md source ctl-n-text)."""
        elided = _read("imexctl_N_570.172_elided.txt").splitlines()
        ours = format_text(_aws_snapshot()).splitlines()
        assert elided[:14] == ours[:14]
        assert elided[-1] == ours[-1]

    def test_hostnames_and_unavailable(self) -> None:
        """-H text with an UNAVAILABLE peer renders as the constructed ISV sample."""
        assert _read("imexctl_N_isv_unavailable_constructed.txt") == format_text(_isv_snapshot(), hostnames=True)

    def test_legend(self) -> None:
        """The legend is the documented one, typo included."""
        assert LEGEND.startswith("Connectivity Table Legend:\n") and "triggreed" in LEGEND
        assert "".join(_read("imexctl_N_570.172_18nodes.txt").splitlines(keepends=True)[:9]) == LEGEND

    def test_every_status_round_trips_through_the_parser(self) -> None:
        """Every connection status the simulator can print comes back unchanged from imexctl's parser."""
        statuses = list(STATUS_LETTERS)
        hosts = [f"127.0.0.{10 + i}" for i in range(len(statuses))]
        nodes = {
            str(i): node_entry(h, "READY", "580.95.05", "", _conns(hosts, statuses[i:] + statuses[:i]))
            for i, h in enumerate(hosts)
        }
        snap = {"nodes": nodes, "timestamp": "1/2/2026 03:04:05.006", "status": "DEGRADED"}
        parsed = parse_domain_text(format_text(snap))
        assert parsed == parse_domain_json(format_json(snap))
        assert [c.status for c in parsed.nodes[3].connections] == statuses[3:] + statuses[:3]


class TestFormatJson:
    def test_key_order_matches_dcgm_sample(self) -> None:
        """Node and connection keys come in the order of the DCGM 580.30 sample."""
        sample = json.loads(_read("imexctl_Nj_580.30_degraded_dcgm.json"))
        ours = json.loads(format_json(_isv_snapshot()))
        assert list(sample) == list(ours)
        assert list(sample["nodes"]["3"]) == list(ours["nodes"]["0"])
        assert list(sample["nodes"]["3"]["connections"]["1"]) == list(ours["nodes"]["0"]["connections"]["1"])

    def test_dcgm_sample_content(self) -> None:
        """A snapshot holding the DCGM sample's content renders to the same JSON data."""
        sample = json.loads(_read("imexctl_Nj_580.30_degraded_dcgm.json"))
        snap = {
            "nodes": {
                "3": node_entry(
                    "10.76.186.255",
                    "READY",
                    "580.30",
                    "",
                    {
                        "1": {"host": "10.76.183.30", "status": "CONNECTED", "changed": True},
                        "6": {"host": "10.76.190.23", "status": "CONNECTED", "changed": True},
                    },
                ),
                "1": node_entry(
                    "10.76.183.30",
                    "READY",
                    "580.30",
                    "",
                    {
                        "0": {"host": "10.76.179.115", "status": "CONNECTED", "changed": True},
                        "1": {"host": "10.76.183.30", "status": "CONNECTED", "changed": True},
                    },
                ),
            },
            "timestamp": "5/22/2025 19:46:40.891",
            "status": "DEGRADED",
        }
        assert sample == json.loads(format_json(snap))

    def test_isv_sample_content(self) -> None:
        """The ISV snapshot with -H renders to the completed ISV JSON sample's data."""
        expected = json.loads(_read("imexctl_Nj_isv_unavailable_completed.json"))
        assert expected == json.loads(format_json(_isv_snapshot(), hostnames=True))

    def test_hostname_blank_without_h(self) -> None:
        """hostName is filled only with -H (design.md source ctl-n-json)."""
        assert json.loads(format_json(_isv_snapshot()))["nodes"]["0"]["hostName"] == ""

    def test_compact_single_line(self) -> None:
        """The JSON is one compact line ending in a newline, nodes in numeric order."""
        out = format_json(_aws_snapshot())
        assert out.endswith("}\n") and out.count("\n") == 1 and ", " not in out
        assert [str(i) for i in range(18)] == list(json.loads(out)["nodes"])


def _nodes(*rows: tuple[str, list[str]]) -> dict[str, Any]:
    hosts = [f"h{i}" for i in range(len(rows))]
    return {str(i): node_entry(hosts[i], st, "v", "", _conns(hosts, links)) for i, (st, links) in enumerate(rows)}


class TestDomainState:
    @pytest.mark.parametrize(
        ("nodes", "local", "expected"),
        [
            pytest.param(_nodes(("READY", ["CONNECTED"])), 0, "UP", id="one-node-up"),
            pytest.param(
                _nodes(("READY", ["CONNECTED", "CONNECTED"]), ("READY", ["CONNECTED", "CONNECTED"])),
                1,
                "UP",
                id="two-nodes-up",
            ),
            pytest.param(
                _nodes(("READY", ["CONNECTED", "NEVER_CONNECTED"]), ("UNAVAILABLE", ["INVALID", "INVALID"])),
                0,
                "DEGRADED",
                id="peer-never-came",
            ),
            pytest.param(
                _nodes(("READY", ["CONNECTED", "RECOVERING"]), ("READY", ["CONNECTED", "CONNECTED"])),
                0,
                "DEGRADED",
                id="one-link-recovering",
            ),
            pytest.param(
                _nodes(("READY", ["CONNECTED", "CONNECTED"]), ("WAITING_FOR_PEERS", ["CONNECTED", "CONNECTED"])),
                0,
                "DEGRADED",
                id="peer-not-ready",
            ),
            pytest.param(
                _nodes(("WAITING_FOR_PEERS", ["CONNECTED", "CONNECTED"]), ("READY", ["CONNECTED", "CONNECTED"])),
                0,
                "DOWN",
                id="local-not-ready",
            ),
            pytest.param(_nodes(("UNAVAILABLE", ["INVALID"])), None, "DOWN", id="no-daemon"),
        ],
    )
    def test_rules(self, nodes: dict[str, Any], local: int | None, expected: str) -> None:
        """UP needs every node READY and every link CONNECTED; a local node not READY means DOWN."""
        assert expected == domain_state(nodes, local)

    def test_unavailable_snapshot(self) -> None:
        """With no daemon the ctl shows every nodes-file line UNAVAILABLE with INVALID links, domain DOWN."""
        snap = unavailable_snapshot(["10.0.0.1", "10.0.0.2"], when=0.0)
        d = parse_domain_text(format_text(snap))
        assert d.status == "DOWN"
        assert {("UNAVAILABLE", "")} == {(n.status, n.version) for n in d.nodes}
        assert d.not_connected() == [(0, 1, "INVALID"), (1, 0, "INVALID")]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run in UTC and restore the time zone afterwards."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class TestTimestamp:
    @pytest.mark.usefixtures("utc")
    @pytest.mark.parametrize(
        ("when", "expected"),
        [
            pytest.param((2026, 5, 4, 6, 8, 10, 0.580), "5/4/2026 06:08:10.580", id="aws-sample"),
            pytest.param((2025, 5, 22, 19, 46, 40, 0.891), "5/22/2025 19:46:40.891", id="dcgm-sample"),
            pytest.param((2025, 12, 31, 0, 0, 0, 0.0), "12/31/2025 00:00:00.000", id="zero-millis"),
        ],
    )
    def test_format(self, when: tuple[int, ...], expected: str) -> None:
        """Timestamps look like the samples: M/D/YYYY HH:MM:SS.mmm."""
        seconds = calendar.timegm((*tuple(int(x) for x in when[:6]), 0, 0, 0)) + when[6]
        assert expected == format_timestamp(seconds)


class TestConfig:
    def test_defaults(self) -> None:
        """An empty file gives the shipped defaults (design.md source imex-config)."""
        cfg = parse_config_text("")
        assert (
            cfg.log_level,
            cfg.daemonize,
            cfg.server_port,
            cfg.wait_for_quorum,
            cfg.cmd_enabled,
            cfg.grace_time_s,
        ) == (4, True, 50000, "RECOVERY", False, -1.0)

    def test_reads_keys_comments_and_unknowns(self) -> None:
        """KEY=VALUE lines are read, comment and blank lines skipped, unknown keys and junk recorded."""
        text = "# c\n\nSERVER_PORT=61000\nIMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=61005\nFOO=1\njunk\nDAEMONIZE=0\n"
        cfg = parse_config_text(text)
        assert (cfg.server_port, cfg.cmd_enabled, cfg.cmd_port, cfg.daemonize, cfg.unknown_keys, cfg.bad_lines) == (
            61000,
            True,
            61005,
            False,
            ("FOO",),
            (7,),
        )

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            pytest.param("SERVER_PORT=abc\n", "SERVER_PORT='abc'", id="port-text"),
            pytest.param("SERVER_PORT=50000 # comment\n", "SERVER_PORT='50000 # comment'", id="trailing-comment"),
            pytest.param("SERVER_PORT=70000\n", "outside", id="port-range"),
            pytest.param("DAEMONIZE=2\n", "DAEMONIZE=2", id="daemonize"),
            pytest.param("IMEX_WAIT_FOR_QUORUM=ALL\n", "IMEX_WAIT_FOR_QUORUM='ALL'", id="quorum"),
        ],
    )
    def test_bad_values(self, text: str, named: str) -> None:
        """Invalid values are refused with the key named."""
        with pytest.raises(SimConfigError, match=named):
            parse_config_text(text)

    def test_nodes_file(self) -> None:
        """One entry per line, final newline optional; order is kept."""
        assert ("10.0.0.2", "tray-a") == parse_nodes_text("10.0.0.2\ntray-a\n") == parse_nodes_text("10.0.0.2\ntray-a")

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            pytest.param("", "no entries", id="empty"),
            pytest.param("10.0.0.1\n\n10.0.0.2\n", "line 2", id="blank-line"),
            pytest.param("# trays\n10.0.0.1\n", "line 1", id="comment"),
            pytest.param("10.0.0.1 10.0.0.2\n", "line 1", id="two-per-line"),
        ],
    )
    def test_bad_nodes_file(self, text: str, named: str) -> None:
        """Lines whose meaning is unconfirmed are refused, naming the line."""
        with pytest.raises(SimConfigError, match=named):
            parse_nodes_text(text)

    def test_map_key(self) -> None:
        """The node-map key changes with order and content, not with case or spacing."""
        key = node_map_key(("10.0.0.1", "tray-b"))
        assert key == node_map_key((" 10.0.0.1", "TRAY-B"))
        assert key != node_map_key(("tray-b", "10.0.0.1"))


class TestFaults:
    def test_empty(self) -> None:
        """No texts give no faults."""
        assert Faults() == parse_faults(["", "# nothing\n"], ["10.0.0.1"])

    def test_all_switches(self) -> None:
        """Every switch parses, from ';' and newline separated texts."""
        env = "slow_start=1.5; never_ready;crash_after=3"
        file_text = (
            "refuse_peer=10.0.0.9\nrefuse_peer=10.0.0.8 # two\nhang_ctl\nblock_cmd\nversion=570.172\nhostname=tray01\n"
        )
        want = Faults(
            slow_start_s=1.5,
            never_ready=True,
            crash_after_s=3.0,
            refuse_peers=frozenset({"10.0.0.9", "10.0.0.8"}),
            hang_ctl=True,
            block_cmd=True,
            version="570.172",
            hostname="tray01",
        )
        assert want == parse_faults([env, file_text], ["10.0.0.1"])

    def test_address_prefix(self) -> None:
        """'@ADDRESS ' entries apply only to the daemon with that address."""
        text = "@10.0.0.2 never_ready\n@10.0.0.1 version=1.0\nhang_ctl"
        assert Faults(version="1.0", hang_ctl=True) == parse_faults([text], ["10.0.0.1", "tray-a"])

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            pytest.param("explode", "unknown fault 'explode'", id="unknown"),
            pytest.param("@10.0.0.2 explode", "unknown fault 'explode'", id="unknown-elsewhere"),
            pytest.param("slow_start=soon", "slow_start='soon'", id="not-a-number"),
            pytest.param("crash_after=-1", "crash_after='-1'", id="negative"),
            pytest.param("never_ready=1", "takes no value", id="value-on-flag"),
            pytest.param("version=", "needs a value", id="empty-value"),
            pytest.param("@10.0.0.1", "expected '@ADDRESS NAME", id="prefix-only"),
        ],
    )
    def test_bad_entries(self, text: str, named: str) -> None:
        """Bad entries raise FaultError naming the entry, also when aimed at another daemon."""
        with pytest.raises(FaultError, match=named):
            parse_faults([text], ["10.0.0.1"])


class TestCtlUsage:
    @pytest.mark.parametrize(
        ("argv", "named"),
        [
            pytest.param([], "exactly one of -q or -N", id="nothing"),
            pytest.param(["-q", "-N"], "exactly one of -q or -N", id="both"),
            pytest.param(["-q", "-j"], "-j and -H only work with -N", id="json-without-N"),
            pytest.param(["-q", "-H"], "-j and -H only work with -N", id="hostnames-without-N"),
            pytest.param(["-q", "-c", "a", "-u", "b"], "only one of -i, -u, or -c", id="two-endpoints"),
            pytest.param(["-q", "-i", "127.0.0.1"], "needs a value", id="i-without-port"),
            pytest.param(["-q", "-i", "127.0.0.1", "x"], "invalid port 'x'", id="i-bad-port"),
            pytest.param(["-q", "-t", "soon"], "invalid timeout 'soon'", id="bad-timeout"),
            pytest.param(["-n"], "-n is not supported", id="monitor"),
            pytest.param(["-q", "--bogus"], "unknown option '--bogus'", id="unknown"),
        ],
    )
    def test_bad_usage(self, argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Bad usage prints the reason and the usage text to stderr and exits 2."""
        assert ctl.main(argv) == 2
        err = capsys.readouterr().err
        assert named in err and "Usage: nvidia-imex-ctl-sim" in err

    def test_equals_form(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """'--u=<path>' (as DRA calls it) is read like '-u <path>'."""
        missing = str(tmp_path / "none.sock")
        assert ctl.main(["-q", f"--u={missing}"]) == 1
        out = capsys.readouterr()
        assert out.out == "UNAVAILABLE\n" and missing in out.err


class TestCtlStartup:
    """The ctl is started once per readiness probe: what it imports is most of a probe's cost."""

    def test_imports_nothing_heavy(self) -> None:
        """Importing the ctl loads neither concurrent.futures (logging), dataclasses, hashlib nor asyncio."""
        heavy = ("concurrent.futures", "logging", "dataclasses", "inspect", "hashlib", "asyncio", "psutil")
        probe = (
            f"import json, sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
            "import imexctl.sim.ctl\n"
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
        )
        out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, cwd="/")
        assert json.loads(out.stdout) == []

    def test_in_parallel_keeps_order(self) -> None:
        """Results come back in the order of the items, with fewer workers than items too."""
        items = [str(i) for i in range(20)]
        assert ctl._in_parallel(lambda x: int(x) * 2, items, workers=3) == [i * 2 for i in range(20)]
        assert ctl._in_parallel(str.upper, [], workers=64) == []

    def test_in_parallel_runs_at_once(self) -> None:
        """Every item is asked at the same time (one slow node does not delay the others' questions)."""
        barrier = threading.Barrier(5, timeout=5)
        assert ctl._in_parallel(lambda x: (barrier.wait(), x)[1], list("abcde"), workers=64) == list("abcde")

    def test_in_parallel_raises_in_caller(self) -> None:
        """An exception in a worker is raised in the calling thread, not lost."""

        def fail(x: str) -> str:
            if x == "b":
                raise KeyError(x)
            return x

        with pytest.raises(KeyError, match="b"):
            ctl._in_parallel(fail, list("abc"), workers=2)
