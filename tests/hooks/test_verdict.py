"""Whose fault it is when trays drop incoming job ports: one, most, or all but one (issue 32 §3).

Each tray keeps one outgoing connection to every peer, and ``nvidia-imex-ctl -N`` shows a node's own
outgoing links in its row (the simulator does the same: imexctl/sim/README.md "Peer links"). A tray whose
firewall drops incoming job ports reaches its peers (its row: CONNECTED), but none of them reaches it
(their rows: NEVER_CONNECTED), no peer's connection arrives in its socket table, and its command port
answers nobody else's ctl. Each test builds exactly what one tray sees in such a rack and runs the real
readiness wait over it (FakeHost): its -N answers, the TCP look at its silent peers' command ports, and its
socket table (``FakeHost.incoming``, ``FakeHost.outgoing``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.config.settings import Settings
from imexctl.hooks import readiness
from imexctl.platform.errors import CommandError, HealthTimeout
from tests.hooks.test_readiness import make_probe
from tests.support.fakes import FakeGpu, FakeHost, domain_json, job_env
from tests.support.racks import rack_addresses
from tests.support.slurmjobs import SlurmJob

SERVER_PORT, CMD_PORT = 61042, 62042


def _view(hosts: Sequence[str], me: int, blocked: set[int]) -> str:
    """The -N -j answer tray ``me`` gets when the trays in ``blocked`` drop incoming job ports."""
    nodes = {}
    for i, host in enumerate(hosts):
        unreachable = i in blocked and i != me  # its command port drops our ctl's connection
        conns = {
            str(j): {"host": peer, "status": "INVALID" if unreachable else
                     ("NEVER_CONNECTED" if j in blocked and j != i else "CONNECTED"), "changed": True}
            for j, peer in enumerate(hosts)
        }  # fmt: skip
        nodes[str(i)] = {"status": "UNAVAILABLE" if unreachable else "READY", "host": host, "connections": conns,
                         "changed": True, "version": "" if unreachable else "580.95.05", "hostName": ""}  # fmt: skip
    return json.dumps({"nodes": nodes, "timestamp": "12/5/2026 10:00:00.000", "status": "DEGRADED"})


def _tray(root: Path, n: int, me: int, blocked: set[int], *, socket_table: bool = True) -> tuple[FakeHost, Any]:
    """A FakeHost and a probe for tray ``me`` of ``n`` (gb01.. at 10.0.0.1..) in that rack."""
    hosts = [f"10.0.0.{i + 1}" for i in range(n)]
    host = FakeHost(addresses=rack_addresses())
    host.domain = lambda _hosts: (0, _view(hosts, me, blocked))
    host.reach = {hosts[i]: "timeout" for i in blocked if i != me}
    # whose outgoing link arrives here: every peer's, unless this tray drops them
    arrives = frozenset() if me in blocked else frozenset(h for i, h in enumerate(hosts) if i != me)
    host.incoming = arrives if socket_table else None
    host.outgoing = frozenset(h for i, h in enumerate(hosts) if i != me and i not in blocked)  # dropped at theirs
    base = make_probe(root, addresses=hosts)
    probe = base._replace(own_address=hosts[me], cmd_port=CMD_PORT, server_port=SERVER_PORT)
    return host, probe


def _verdict(host: FakeHost, probe: Any, make_settings: Callable[..., Settings]) -> HealthTimeout:
    s = make_settings(readiness={"deadline_s": 2})
    with pytest.raises(HealthTimeout) as info:
        readiness.wait_ready(host, s, probe, deadline=host.monotonic() + 2, log=structlog.get_logger())
    return info.value


def _kind(exc: HealthTimeout) -> str:
    return "own" if exc.isolated else "unsure" if exc.unsure else "peers"


@pytest.mark.parametrize(
    ("n", "blocked", "me", "kind"),
    [
        pytest.param(4, {3}, 3, "own", id="one-of-4-the-blocked-tray"),
        pytest.param(4, {3}, 0, "peers", id="one-of-4-a-healthy-tray"),
        pytest.param(4, {2, 3}, 2, "own", id="two-of-4-a-blocked-tray"),
        pytest.param(4, {2, 3}, 0, "peers", id="two-of-4-a-healthy-tray"),
        pytest.param(4, {1, 2, 3}, 1, "own", id="three-of-4-a-blocked-tray"),
        pytest.param(4, {1, 2, 3}, 0, "unsure", id="three-of-4-the-healthy-tray"),
        pytest.param(2, {1}, 1, "own", id="two-trays-the-blocked-one"),
        pytest.param(2, {1}, 0, "peers", id="two-trays-the-healthy-one"),
    ],
)
def test_trays_dropping_incoming_job_ports_know_it(root: Path, make_settings: Callable[..., Settings], n: int,
                                                   blocked: set[int], me: int, kind: str) -> None:  # fmt: skip
    """A tray that reaches peers that never reach it is at fault (own: drained whatever became of the job); a
    healthy tray that some peers cannot reach waits for the requeue (peers); the one healthy tray among broken
    ones, which reaches none of them though they reach it, is unsure (it gives way to the sure ones)."""
    host, probe = _tray(root, n, me, blocked)
    exc = _verdict(host, probe, make_settings)
    assert _kind(exc) == kind, str(exc)
    if kind == "own" and n > 2:
        assert "no peer connects to it: check this tray's firewall for incoming job ports" in str(exc)
        assert "never connect to it though it reaches them" in exc.summary
    if kind == "unsure":
        assert "connect to it: their incoming job ports are blocked, or this tray's outgoing" in str(exc)
    assert ("tcp_links", probe.own_address, str(SERVER_PORT)) in host.calls


def test_without_a_socket_table_the_rows_still_convict_the_blocked_tray(
    root: Path, make_settings: Callable[..., Settings]
) -> None:
    """/proc/net/tcp unreadable: the peers' own rows (none connects to this tray, it reaches them) decide."""
    host, probe = _tray(root, 4, 3, {3}, socket_table=False)
    assert _kind(_verdict(host, probe, make_settings)) == "own"


def test_a_connection_that_arrives_clears_the_tray(root: Path, make_settings: Callable[..., Settings]) -> None:
    """A peer's connection in the socket table shows incoming traffic works: the rows alone convict nobody."""
    host, probe = _tray(root, 4, 3, {3})
    host.incoming = frozenset({"10.0.0.1"})
    assert _kind(_verdict(host, probe, make_settings)) == "peers"


def test_a_peer_that_reaches_nobody_is_not_blamed_on_this_tray(
    root: Path, make_settings: Callable[..., Settings]
) -> None:
    """gb02 drops its outgoing job ports: it reaches nobody, but gb03 and gb04 reach this tray: not its fault."""
    hosts = [f"10.0.0.{i}" for i in range(1, 5)]
    host, probe = _tray(root, 4, 0, set())
    doc = json.loads(_view(hosts, 0, set()))
    for conn in doc["nodes"]["1"]["connections"].values():
        conn["status"] = "NEVER_CONNECTED"
    host.domain = lambda _hosts: (0, json.dumps(doc))
    host.incoming = frozenset({"10.0.0.3", "10.0.0.4"})
    assert _kind(_verdict(host, probe, make_settings)) == "peers"


def _gb04_prolog(host: FakeHost, root: Path, make_settings: Callable[..., Settings], job: SlurmJob) -> Any:
    """gb04's prolog in gb[01-04] (job 42, restart count 0) over ``host``, slurmctld holding ``job``; the result,
    or the HealthTimeout raised."""
    from imexctl.hooks.prolog import prolog
    from imexctl.hooks.runtime import Runtime

    host.slurm_nodes["gb04"] = {"state": "ALLOCATED"}
    host.slurm_jobs[42] = job
    conf = root / "slurm.conf"
    conf.write_text("ClusterName=x\nNodeName=gb[01-04]\nPrologFlags=Alloc,DeferBatch\n")
    rt = Runtime(host, FakeGpu(), make_settings(node="gb04", readiness={"deadline_s": 2}), structlog.get_logger())
    env = job_env(job_id=42, nodelist="gb[01-04]", node="gb04", SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO",
                  SLURM_JOB_RESTART_COUNT="0")  # fmt: skip
    try:
        return prolog(env, rt)
    except HealthTimeout as exc:
        return exc


@pytest.mark.parametrize(
    ("job", "drained"),
    [
        pytest.param(SlurmJob(42, "PENDING", reason="launch_failed_requeued_held", restarts=1), True, id="requeued"),
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]", restarts=1), True, id="requeued-completing"),
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]"), False, id="cancelled-completing"),
        pytest.param(SlurmJob(42, "CANCELLED", "gb[01-04]"), False, id="cancelled"),
    ],
)
def test_the_blocked_tray_drains_itself_unless_the_job_is_over(
    root: Path, make_settings: Callable[..., Settings], job: SlurmJob, drained: bool
) -> None:
    """Through the prolog: the tray whose incoming ports are blocked asks slurmctld once, and fails although the
    job was requeued (a requeue is no end), naming the peers it reaches by node name; for a job that is over
    (cancelled: COMPLETING with the restart count this run started with) it exits 0, drained for nothing."""
    host, _ = _tray(root, 4, 3, {3})
    out = _gb04_prolog(host, root, make_settings, job)
    assert len([c for c in host.calls if c[0].endswith("squeue")]) == 1
    assert host.now - 1000.0 <= 2 + 0.5, "the tray sure of its own fault waited for slurmctld"
    if not drained:
        assert not isinstance(out, HealthTimeout) and out.job_ended == job.state, str(out)
        assert "DRAIN" not in host.slurm_nodes["gb04"]["state"]
        return
    assert isinstance(out, HealthTimeout) and out.isolated, str(out)
    reason = host.slurm_nodes["gb04"]["reason"]
    assert reason.startswith("imex:not_ready gb04 job 42: peers gb01,gb02,gb03 never connect to it"), reason


@pytest.mark.parametrize(("requeue_after", "exits_0"), [(2.0, True), (4.0, False)])
def test_an_unsure_tray_waits_half_the_window(root: Path, make_settings: Callable[..., Settings],
                                              requeue_after: float, exits_0: bool) -> None:  # fmt: skip
    """The one healthy tray among three that drop incoming ports asks for half of timeout_margin_s (6 s): the
    sure ones fail at once and their requeue comes within it; a requeue 4 s late finds it failed already."""
    from imexctl.hooks.prolog import prolog
    from imexctl.hooks.runtime import Runtime
    from tests.hooks.test_requeue import Slurmctld

    plain, _ = _tray(root, 4, 0, {1, 2, 3})
    host = Slurmctld(addresses=plain.addresses, domain=plain.domain, reach=plain.reach, incoming=plain.incoming)
    host.slurm_nodes["gb01"] = {"state": "ALLOCATED"}
    conf = root / "slurm.conf"
    conf.write_text("ClusterName=x\nNodeName=gb[01-04]\nPrologFlags=Alloc,DeferBatch\n")
    s = make_settings(readiness={"deadline_s": 2}, slurm={"timeout_margin_s": 6})
    host.requeue_at = 1000.0 + 2 + requeue_after
    env = job_env(job_id=42, nodelist="gb[01-04]", SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO")
    try:
        out: Any = prolog(env, Runtime(host, FakeGpu(), s, structlog.get_logger()))
    except HealthTimeout as exc:
        out = exc
    assert (not isinstance(out, HealthTimeout) and out.job_ended == "PENDING") is exits_0, str(out)
    assert host.now - 1000.0 <= 2 + 3 + 0.1  # half the 6 s window
    if not exits_0:
        assert host.slurm_nodes["gb01"]["reason"].startswith("imex:not_ready gb01 job 42: reaches none of its 3 peers")


def _ctl_hangs_on_n(plain: FakeHost) -> None:
    """``-N`` gets no answer (the ctl waits on a peer whose command port drops it); ``-q`` still answers."""

    def hang(_hosts: Any) -> tuple[int, str]:
        plain.now += 1.0
        raise CommandError(("/usr/bin/nvidia-imex-ctl", "-N", "-j"), "no answer within 1s")

    plain.domain = hang


@pytest.mark.parametrize(
    ("blocked", "me", "kind"),
    [
        pytest.param({2, 3}, 2, "own", id="two-of-4-a-blocked-tray"),
        pytest.param({2, 3}, 0, "peers", id="two-of-4-a-healthy-tray"),
        pytest.param({1, 2, 3}, 1, "own", id="three-of-4-a-blocked-tray"),
        pytest.param({1, 2, 3}, 0, "unsure", id="three-of-4-the-healthy-tray"),
    ],
)
def test_without_any_n_answer_the_socket_table_speaks(root: Path, make_settings: Callable[..., Settings],
                                                       blocked: set[int], me: int, kind: str) -> None:  # fmt: skip
    """Every -N hangs on a blocked tray's command port: a blocked tray's table shows it connected to the healthy
    peers and nobody to it (its fault); a healthy tray's shows connections arriving (a peer's fault, or unsure
    when it reaches none of them)."""
    host, probe = _tray(root, 4, me, blocked)
    _ctl_hangs_on_n(host)
    exc = _verdict(host, probe, make_settings)
    assert _kind(exc) == kind, str(exc)
    if me in blocked:
        healthy = [f"10.0.0.{i + 1}" for i in range(4) if i not in blocked]
        assert f"reaches {', '.join(healthy)}, but no peer connects to it (its socket table" in str(exc)
        assert exc.summary.startswith(f"peers {','.join(healthy)} never connect to it though it reaches them")


def test_a_peer_not_ready_yet_is_no_evidence_against_this_tray(root: Path,
                                                               make_settings: Callable[..., Settings]) -> None:  # fmt: skip
    """Two trays; gb02 answers -N but never leaves INITIALIZING (its links not started): this tray reaches it and
    nothing arrives, but -N shows why. Not this tray's fault: it waits for the requeue (gb02's own failure)."""
    host, probe = _tray(root, 2, 0, set())
    doc = json.loads(_view(["10.0.0.1", "10.0.0.2"], 0, set()))
    doc["nodes"]["1"]["status"] = "INITIALIZING"
    doc["nodes"]["1"]["connections"]["0"]["status"] = "NEVER_CONNECTED"
    host.domain = lambda _hosts: (0, json.dumps(doc))
    host.incoming, host.outgoing = frozenset(), frozenset({"10.0.0.2"})
    assert _kind(_verdict(host, probe, make_settings)) == "peers"


def _cut_off_gb04(root: Path) -> FakeHost:
    """gb04 never reached gb01-gb03's command services (their ports time out) and no connection of theirs arrives."""
    host, _ = _tray(root, 4, 3, set())
    host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status=dict.fromkeys(range(3),
                                                "UNAVAILABLE"), conn_status="INVALID"))  # fmt: skip
    host.reach = {f"10.0.0.{i}": "timeout" for i in (1, 2, 3)}
    host.incoming = frozenset()
    return host


def _socket_table_gb04(root: Path) -> FakeHost:
    """gb03 and gb04 drop incoming job ports and every -N hangs: gb04's socket table is all it has."""
    host, _ = _tray(root, 4, 3, {2, 3})
    _ctl_hangs_on_n(host)
    return host


#: the evidence of each own-fault verdict, as gb04 of gb[01-04] sees it (verdict.py)
OWN_FAULT = {
    "rows": lambda root: _tray(root, 4, 3, {3})[0],
    "socket-table": _socket_table_gb04,
    "cut-off": _cut_off_gb04,
}


@pytest.mark.parametrize("evidence", sorted(OWN_FAULT))
@pytest.mark.parametrize(
    ("job", "exits_0"),
    [
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]"), True, id="cancelled-completing"),
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]", restarts=1), False, id="requeued-completing"),
        pytest.param(SlurmJob(42, "RUNNING", "gb[01-04]"), False, id="running"),
    ],
)
def test_no_own_fault_verdict_drains_the_tray_of_a_job_that_is_over(
    root: Path, make_settings: Callable[..., Settings], evidence: str, job: SlurmJob, exits_0: bool
) -> None:
    """Issue 41: every verdict that blames the tray itself (its incoming ports from the rows or its socket table,
    cut off) first asks slurmctld once; a job that is over lets it exit 0, and what it logs blames no port of
    its; a job that may run again (requeued, still starting) does not."""
    host = OWN_FAULT[evidence](root)
    with capture_logs() as logs:
        out = _gb04_prolog(host, root, make_settings, job)
    assert len([c for c in host.calls if c[0].endswith("squeue")]) == 1
    if not exits_0:
        assert isinstance(out, HealthTimeout) and out.isolated and "DRAIN" in host.slurm_nodes["gb04"]["state"]
        return
    assert not isinstance(out, HealthTimeout) and out.job_ended == "COMPLETING", str(out)
    assert "DRAIN" not in host.slurm_nodes["gb04"]["state"]
    (ended,) = [e for e in logs if e["event"] == "prolog.job_ended"]
    assert not any(w in ended["reason"] for w in ("firewall", "incoming", "connects to it", "interfaces")), ended
