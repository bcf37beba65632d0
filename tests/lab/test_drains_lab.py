"""Which tray Slurm drains when a tray is cut off from its peers, or refuses them, under the real slurmd (issue 22);
and the reason a config that does not load leaves, which ``imexctl drains`` folds by block (issue 42).

node3's network namespace gets an nftables table that drops every TCP packet to or from the two per-job
port ranges (61000-62999) on its link to the others (its own traffic on ``lo`` passes): a tray whose firewall lets through only what a site opened for the stock
daemon. In a three-tray job node3's own daemon gets READY, but it never reaches a peer. Its prolog must
fail, naming why, whatever became of the job, so Slurm drains node3; before issue 22 it could exit 0 when
slurmctld requeued the job for the healthy tray that timed out first. Each healthy tray names node3 as
the peer whose command service never answered. docs/design.md "Which tray Slurm drains" has the cases.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import JOB_TIMEOUT, drains_view, events, imexctl_settings, leftovers, sbatch
from tests.lab.procs import SYS_PATH
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

pytestmark = pytest.mark.slurm

TRAYS = NODES[:3]
CUT = "node3"
TABLE = "imexctl_lab_cut"


def _nft(lab: SlurmLab, node: str, *args: str) -> None:
    nft = shutil.which("nft", path=SYS_PATH)
    if nft is None:
        unavailable("nft missing (apt-get install nftables)")
    subprocess.run(["ip", "netns", "exec", lab.netns(node), nft, *args], check=True, timeout=30, capture_output=True)


def _summaries(lab: SlurmLab, job: int) -> dict[str, dict[str, object]]:
    """Each tray's last ``prolog.done`` of the job, once every tray has one."""
    return _summaries_of(lab, job, TRAYS)


def _summaries_of(lab: SlurmLab, job: int, trays: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each of these trays' last ``prolog.done`` of the job, once every one has one."""

    def ended() -> dict[str, dict[str, Any]] | None:
        done = {n: events(lab, n, job, "prolog.done") for n in trays}
        return {n: d[-1] for n, d in done.items()} if all(done.values()) else None

    return wait_for(ended, JOB_TIMEOUT, 0.5, what=f"the prologs of job {job}")


@pytest.fixture
def cut_off(lab: SlurmLab) -> Iterator[str]:
    """node3 with the job port ranges dropped both ways, then as before."""
    _nft(lab, CUT, "add", "table", "inet", TABLE)
    try:
        for hook, iface in (("input", "iifname"), ("output", "oifname")):
            _nft(lab, CUT, "add", "chain", "inet", TABLE, hook, f"{{ type filter hook {hook} priority 0; }}")
            for port in ("dport", "sport"):  # the tray's own traffic (lo: its ctl to its daemon) passes
                _nft(
                    lab, CUT, "add", "rule", "inet", TABLE, hook, iface, "!=", "lo", "tcp", port, "61000-62999", "drop"
                )
        yield CUT
    finally:
        _nft(lab, CUT, "delete", "table", "inet", TABLE)


def test_tray_cut_off_by_its_firewall_is_the_one_drained(lab: SlurmLab, cut_off: str) -> None:
    """node3 never reaches its peers: its prolog fails naming that, and node3 is drained; peers name node3."""
    job = sbatch(lab, "true", TRAYS)
    done = _summaries(lab, job)
    cut = done[cut_off]
    assert cut["ok"] is False and cut["error_code"] == "not_ready", cut
    assert "never reached the command service of any of its 2 peers" in str(cut["reason"]), cut
    wait_for(lambda: lab.node_states()[cut_off]["state"].startswith("drain"), 30, 0.5, what=f"{cut_off} drained")
    # Slurm shows the hook's own reason, code first, naming the tray (not Slurm's "Prolog error")
    shown = lab.node_states()[cut_off]["reason"]
    assert shown.startswith(f"imex:not_ready {cut_off} job {job}: "), shown
    for node in TRAYS:
        if node == cut_off:
            continue
        last = done[node]
        if last.get("ok"):  # slurmctld had already requeued the job when this tray asked
            assert last.get("job_ended"), f"{node}: {last}"
        else:
            # the cut-off tray is named, its command port taking no connection (nothing comes back)
            want = rf"{re.escape(lab.addr(cut_off))} \([^)]*TCP port \d+: timeout\)"
            assert re.search(want, str(last["reason"])), f"{node}: {last}"
            assert "never reached" not in str(last["reason"]), f"{node}: {last}"
    lab.run(["scancel", str(job)], check=False)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
    for node in TRAYS:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back"


def test_peer_that_refuses_connections_is_drained_and_named(lab: SlurmLab) -> None:
    """node3's daemon refuses both peers (``refuse_peer``): the other two connect to each other and none to
    node3, so node3 fails as the tray left out, whatever became of the job, and is drained; its peers name it
    (or exit 0 when slurmctld already took the job back)."""
    lab.faults.write_text("".join(f"@{lab.addr(CUT)} refuse_peer={lab.addr(n)}\n" for n in TRAYS if n != CUT))
    job = sbatch(lab, "true", TRAYS)
    done = _summaries(lab, job)
    assert done[CUT]["ok"] is False and done[CUT]["error_code"] == "not_ready", done[CUT]
    # the domain formed without it: it fails even when the job went back to the queue meanwhile
    assert "the other trays connected to each other but none of them to this tray" in str(done[CUT]["reason"])
    wait_for(lambda: lab.node_states()[CUT]["state"].startswith("drain"), 30, 0.5, what=f"{CUT} drained")
    shown = lab.node_states()[CUT]["reason"]
    assert shown.startswith(f"imex:not_ready {CUT} job {job}: "), shown
    for node in TRAYS:
        if node == CUT:
            continue
        last = done[node]
        if last.get("ok"):
            assert last.get("job_ended"), f"{node}: {last}"
        else:  # the refusing tray says READY of itself; the peers name it as the one nobody linked to
            assert f"peers that never answered: {lab.addr(CUT)} (" in str(last["reason"]) or (
                f"; {lab.addr(CUT)} (" in str(last["reason"])
            ), f"{node}: {last}"
            assert "none of them to this tray" not in str(last["reason"]), f"{node}: {last}"
    lab.run(["scancel", str(job)], check=False)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
    for node in TRAYS:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back"


DROP_IN = "imexctl_lab_drop_in"


@contextlib.contextmanager
def _incoming_dropped(lab: SlurmLab, nodes: Sequence[str]) -> Iterator[None]:
    """These trays' firewalls drop incoming TCP to the job port ranges (a half-done firewall change)."""
    done: list[str] = []
    try:
        for node in nodes:
            _nft(lab, node, "add", "table", "inet", DROP_IN)
            done.append(node)
            _nft(lab, node, "add", "chain", "inet", DROP_IN, "input", "{ type filter hook input priority 0; }")
            _nft(lab, node, "add", "rule", "inet", DROP_IN, "input", "iifname", "!=", "lo", "tcp", "dport",
                 "61000-62999", "drop")  # fmt: skip
        yield
    finally:
        for node in done:
            _nft(lab, node, "delete", "table", "inet", DROP_IN)


@pytest.mark.parametrize("blocked", [("node3",), ("node3", "node4")], ids=["one-tray", "two-of-four"])
def test_trays_that_drop_incoming_job_ports_are_the_ones_drained(lab: SlurmLab, blocked: tuple[str, ...]) -> None:
    """Issue 32 §3: a tray that reaches its peers while none of them reaches it fails, naming them, and is
    drained, whatever became of the job; the healthy trays wait for the requeue it causes and exit 0 (idle).
    With two blocked trays every -N waits on a dropped command port (the simulator's ctl has no timeout of its
    own), so the blocked trays judge from their socket tables.
    The deadline is 10 s so the lab's PrologEpilogTimeout=30 leaves the whole timeout_margin_s for that."""
    with _incoming_dropped(lab, blocked), imexctl_settings(lab, {"readiness": {"deadline_s": "10"}}):
        job = sbatch(lab, "true", NODES)
        done = _summaries_of(lab, job, NODES)
        wait_for(lambda: all(lab.node_states()[n]["state"].startswith("drain") for n in blocked), 30, 0.5,
                 what=f"{', '.join(blocked)} drained")  # fmt: skip
    for node in NODES:
        last = done[node]
        if node in blocked:
            assert last["ok"] is False and last["error_code"] == "not_ready", f"{node}: {last}"
            # sure from the peers' -N rows, or (when a peer's dropped command port holds -N up) from its socket table
            assert "but no peer connects to it" in last["reason"], f"{node}: {last}"
            assert "check this tray's firewall for incoming job ports" in last["reason"], f"{node}: {last}"
        else:
            assert last["ok"] is True and last.get("job_ended"), f"{node}: {last}"
    wait_for(lambda: not lab.run(["squeue", "-h", "-t", "CG"], check=False).stdout.strip(), 30, 0.5, what="epilogs")
    states = lab.node_states()
    for node in NODES:
        if node in blocked:
            reached = ",".join(n for n in NODES if n not in blocked)
            want = f"imex:not_ready {node} job {job}: peers {reached}"
            assert states[node]["reason"].startswith(want) and "never connect to it" in states[node]["reason"], states
        else:
            assert states[node]["state"] == "idle", states
    lab.run(["scancel", str(job)], check=False)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
    for node in NODES:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back"
    for node in blocked:
        lab.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    lab.wait_idle()


def test_a_config_that_does_not_load_drains_each_tray_with_its_line(lab: SlurmLab) -> None:
    """Issue 42: a config pushed to every tray that does not load: each prolog exits 78 and drains its own tray
    with ``imex:config_invalid <tray> job <id>: <file>:<line>: ...`` (Slurm's would be ``Prolog error``), by the
    built-in settings; ``imexctl drains`` folds the four trays into one line per block, with the command that
    says why on each."""
    with imexctl_settings(lab, {"readiness": {"soon": "1"}}):
        line = lab.imexctl_conf.read_text().splitlines().index("soon = 1") + 1
        job = sbatch(lab, "true", NODES)
        want = {n: f"imex:config_invalid {n} job {job}: {lab.imexctl_conf}:{line}: [readiness] soon: unknown key"
                for n in NODES}  # fmt: skip
        wait_for(lambda: {n: st["reason"] for n, st in lab.node_states().items()} == want, 60, 0.5,
                 what="every tray drained with the config's file and line")  # fmt: skip
        shown = lab.run(["sinfo", "-R", "-h"]).stdout  # the 20 columns an admin sees first
        assert shown.count("imex:config_invalid ") == len(NODES), shown
        view = drains_view(lab)
    groups = [(g["label"], g["block"], g["trays"], g["nodes"]) for g in view["groups"]]
    assert groups == [("imex:config_invalid", "b1", 2, "node[1-2]"), ("imex:config_invalid", "b2", 2, "node[3-4]")]
    assert view["commands"] == [{"nodes": "node[1-4]", "command": "imexctl doctor"}]
    assert {t["job"] for t in view["trays"]} == {job}
    print(f"drained: {want[NODES[0]]!r}; drains: {groups}")
    lab.run(["scancel", str(job)], check=False)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
    for node in NODES:
        lab.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    lab.wait_idle()
