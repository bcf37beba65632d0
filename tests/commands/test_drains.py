"""imexctl drains: the drained trays by code and block, from what real slurmctlds answered (issue 42).

The answers are recorded from the lab of each Slurm version (tests/lab/answers.py --drains,
tests/data/slurm/drains-<version>.json): six trays drained with two hooks' reasons of one code, another
hook's, health's with a tag before and after it, NHC's and an admin's that holds sinfo's separator; then
the admin's reason with a newline and a forged record after it; and none drained.  The fake answers only
those exact questions (tests/support/fakes.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imexctl import cli
from imexctl.commands import drains
from tests.conftest import write_config
from tests.support.fakes import FakeHost

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")
#: the blocks of the recorded trays, as an admin's topology.conf has them
TOPOLOGY = "BlockName=r01 Nodes=node[1-3]\nBlockName=r02 Nodes=node[4-6]\nBlockSizes=3\n"


def answers(version: str, what: str) -> list[dict[str, Any]]:
    """The recorded sinfo answers of one situation (both questions)."""
    data = json.loads((DATA / f"drains-{version}.json").read_text())
    found = [a for a in data["answers"] if a["what"] == what]
    assert len(found) == 2, f"{version}: {what}"
    return found


@pytest.fixture
def site(root: Path) -> Path:
    """A login node's config: the topology source the hooks read."""
    (root / "etc/slurm").mkdir(parents=True)
    (root / "etc/slurm/topology.conf").write_text(TOPOLOGY)
    (root / "etc/slurm/topology.conf").chmod(0o644)
    return write_config(root, {"paths": {"root": str(root), "topology_file": "/etc/slurm/topology.conf"}})


def run(config: Path, host: FakeHost, *args: str, **env: str) -> int:
    return cli.main(["--config", str(config), "drains", *args], env=env, host=host)


def sinfos(host: FakeHost) -> list[tuple[str, ...]]:
    return [c for c in host.calls if Path(c[0]).name == "sinfo"]


@pytest.mark.parametrize("version", VERSIONS)
def test_trays_fold_by_code_and_block_with_the_command_that_says_why(
    site: Path, host: FakeHost, version: str, capsys: Any
) -> None:
    """Two trays of one code in one block are one line; a tag before or after a reason of ours changes nothing;
    an admin's reason is counted as it is, its '|' kept; every tray of ours gets its command."""
    host.sinfo_answers = answers(version, "drained")
    assert run(site, host) == 0
    assert capsys.readouterr().out == (
        "TRAYS  BLOCK  REASON                         NODES\n"
        "    2  r01    imex:config_invalid            node[1-2]\n"
        "    1  r01    imex:not_ready                 node3\n"
        "    1  r02    imexh:stale_daemon             node4\n"
        "    1  r02    imexn:config_invalid           node5\n"
        "    1  r02    other: bad DIMM | ticket 4711  node6\n"
        "\n"
        "why, on each tray as root:\n"
        "  node[1-2]: imexctl doctor\n"
        "  node3: imexctl why 13\n"
        "  node[4-5]: imexctl health --check-only\n"
    )
    # sinfo beside [commands] scontrol, seconds since the epoch, without then with the reasons, nothing else
    assert sinfos(host) == [drains.sinfo_argv("/usr/bin/sinfo", reasons=r) for r in (False, True)]
    assert [c for c in host.calls if Path(c[0]).name != "sinfo"] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_json_names_each_tray_its_owner_code_job_and_block(
    site: Path, host: FakeHost, version: str, capsys: Any
) -> None:
    host.sinfo_answers = answers(version, "drained")
    assert run(site, host, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok" and out["exit_code"] == 0
    trays = {t["node"]: t for t in out["data"]["trays"]}
    assert list(trays) == [f"node{i}" for i in range(1, 7)]  # one each, though sinfo lists every partition's
    got = {n: (t["owner"], t["code"], t["job"], t["block"], t["why"]) for n, t in trays.items()}
    assert got == {
        "node1": ("hook", "config_invalid", 12, "r01", "imexctl doctor"),
        "node2": ("hook", "config_invalid", 12, "r01", "imexctl doctor"),
        "node3": ("hook", "not_ready", 13, "r01", "imexctl why 13"),
        "node4": ("health", "stale_daemon", None, "r02", "imexctl health --check-only"),
        "node5": ("nhc", "config_invalid", None, "r02", "imexctl health --check-only"),
        "node6": (None, None, None, "r02", None),
    }
    assert trays["node4"]["reason"].startswith("[ticket-7] imexh:stale_daemon node4: ")
    assert trays["node6"]["reason"] == "bad DIMM | ticket 4711" and trays["node6"]["state"] == "idle+drain"
    assert isinstance(trays["node1"]["since"], int) and trays["node1"]["since"] > 1_700_000_000
    groups = [(g["label"], g["block"], g["trays"], g["nodes"]) for g in out["data"]["groups"]]
    assert groups[0] == ("imex:config_invalid", "r01", 2, "node[1-2]")
    assert out["data"]["topology"].endswith("/topology.conf")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_reason_with_a_newline_is_read_from_scontrol_not_from_the_lines(
    site: Path, host: FakeHost, version: str, capsys: Any
) -> None:
    """node6's reason holds a newline and a line shaped like node1's record with another reason: sinfo's lines are
    no longer one per record, so every reason is read from scontrol show node, field by field."""
    host.sinfo_answers = answers(version, "forged")
    data = json.loads((DATA / f"drains-{version}.json").read_text())
    for node, reason in data["drains"].items():
        host.slurm_nodes[node] = {"state": "IDLE+DRAIN", "reason": reason}
    host.slurm_nodes["node6"]["reason"] = data["forged"]
    assert run(site, host, "--json") == 0
    out = json.loads(capsys.readouterr().out)["data"]
    trays = {t["node"]: t for t in out["trays"]}
    assert trays["node1"]["code"] == "config_invalid" and trays["node1"]["owner"] == "hook"
    assert trays["node6"]["reason"] == "maintenance" and trays["node6"]["ours"] is False
    assert out["notes"] == ["a reason holds a newline: reasons read with scontrol show node"]
    shown = [c[3] for c in host.calls if Path(c[0]).name == "scontrol"]
    assert shown == [f"node{i}" for i in range(1, 7)]


@pytest.mark.parametrize("version", VERSIONS)
def test_none_drained(site: Path, host: FakeHost, version: str, capsys: Any) -> None:
    host.sinfo_answers = answers(version, "none drained")
    assert run(site, host) == 0
    assert capsys.readouterr().out == "no drained trays\n"
    assert len(sinfos(host)) == 1  # nothing to ask the reasons of


def test_without_a_topology_source_the_blocks_are_unknown(root: Path, host: FakeHost, capsys: Any) -> None:
    config = write_config(root, {"paths": {"root": str(root)}})
    host.sinfo_answers = answers("26.05", "drained")
    assert run(config, host) == 0
    out = capsys.readouterr().out
    assert "    2  -      imex:config_invalid            node[1-2]\n" in out
    assert out.splitlines()[-1] == (
        "note: no topology source ([topology] source, [paths] topology_file): blocks unknown"
    )


def test_a_config_that_does_not_load_is_no_reason_to_fail(root: Path, host: FakeHost, capsys: Any) -> None:
    """The broken file pushed to every tray may be what drained them: the view still comes, by the built-in
    settings (sinfo beside the built-in scontrol), and says why no block is known."""
    bad = root / "imexctl.conf"
    bad.write_text("[paths]\ntopology_file = relative/topology.conf\n")
    host.sinfo_answers = answers("24.11", "drained")
    assert run(bad, host) == 0
    out = capsys.readouterr().out
    assert "    2  -      imex:config_invalid            node[1-2]\n" in out
    assert out.splitlines()[-1].startswith(
        f"note: the config file does not load, built-in settings used, blocks unknown: {bad}: [paths] topology_file"
    )
    assert {c[0] for c in host.calls} == {"/usr/bin/sinfo"}


def test_the_callers_slurm_conf_reaches_sinfo(site: Path, host: FakeHost) -> None:
    host.sinfo_answers = answers("26.05", "none drained")
    run(site, host, SLURM_CONF="/etc/slurm-lab/slurm.conf")
    assert [e for _, e in host.envs] == [{"SLURM_TIME_FORMAT": "%s", "SLURM_CONF": "/etc/slurm-lab/slurm.conf"}]


@pytest.mark.parametrize(
    ("how", "message"),
    [("hangs", "sinfo: no answer within 3s"), ("fails", "sinfo: exit 1: slurm_load_node error: Unable to contact")],
)
def test_sinfo_that_cannot_answer_is_slurm_query_failed(
    site: Path, host: FakeHost, how: str, message: str, capsys: Any
) -> None:
    """Bounded by [slurm] query_timeout_s; exit 69 with sinfo's own words, and nothing printed on stdout."""
    if how == "hangs":
        host.sinfo_hangs = True
    else:
        argv = list(drains.sinfo_argv("sinfo", reasons=False))
        error = "slurm_load_node error: Unable to contact slurm controller (connect failure)\n"
        host.sinfo_answers = [{"argv": argv, "env": drains.TIME_ENV, "rc": 1, "stdout": "", "stderr": error}]
    assert run(site, host) == 69
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and "(slurm_query_failed, exit 69)" in captured.err


@pytest.mark.parametrize(
    "line",
    ["node1|idle+drain|1796530015", "node1 node2|idle+drain|1|", "|idle+drain|1|", "node1||1|", "node1|a|1|b|"],
)
def test_a_line_that_is_not_a_record_is_refused(line: str) -> None:
    with pytest.raises(Exception, match="not NODE\\|STATE\\|TIME\\|"):
        drains.parse_records(line + "\n")
