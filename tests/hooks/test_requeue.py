"""A healthy tray whose peer failed asks slurmctld again until the requeue lands (issue 32 §3, issue 34 §5).

All trays reach their deadline together; the broken tray's failure reaches slurmctld only after its
roll-back, so one question at the deadline races the requeue. Under ``PrologFlags=Alloc,DeferBatch``
(slurmctld holds the batch script until every prolog reported, and never launches a job that went back
to the queue) a healthy tray asks again over ``[slurm] timeout_margin_s``; without DeferBatch it asks once.
The fake slurmctld below answers RUNNING until its clock reaches the moment of the requeue.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import HealthTimeout
from imexctl.platform.host import Completed
from tests.support.fakes import FakeGpu, FakeHost, domain_json, job_env
from tests.support.racks import rack_addresses
from tests.support.slurmjobs import SlurmJob

RUNNING = SlurmJob(42, "RUNNING", "gb[01-03]")
REQUEUED = SlurmJob(42, "PENDING", reason="launch_failed_requeued_held", restarts=1)
DEADLINE_S = 5
#: slurm.conf lists the trays: a domain has its place in their clique (its channel number)
NODES = "NodeName=gb[01-18]\n"


@dataclasses.dataclass
class Slurmctld(FakeHost):
    """slurmctld that takes job 42 back (requeued, held) when its clock reaches ``requeue_at``."""

    requeue_at: float = float("inf")

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        self.slurm_jobs[42] = REQUEUED if self.now >= self.requeue_at else RUNNING
        return super().run(argv, timeout_s=timeout_s, env=env)


def _healthy(host: FakeHost) -> FakeHost:
    """Three trays; this one (gb01) READY, gb02 says WAITING_FOR_PEERS (its own prolog will fail)."""
    host.slurm_nodes["gb01"] = {"state": "ALLOCATED"}
    host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"}))
    return host


@pytest.fixture
def ctld() -> Slurmctld:
    """:func:`_healthy`'s tray, under a slurmctld that requeues the job at ``requeue_at``."""
    host = Slurmctld(addresses=rack_addresses())
    _healthy(host)
    return host


def _prolog(host: FakeHost, make_settings: Callable[..., Settings], root: Path, flags: str,
            timeout: str = "", restarts: str | None = None, **sections: dict[str, Any]) -> Any:  # fmt: skip
    """Run gb01's prolog under a slurm.conf with these PrologFlags (SLURM_JOB_RESTART_COUNT ``restarts``); the
    result, or the HealthTimeout raised."""
    conf = root / "slurm.conf"
    conf.write_text(f"ClusterName=x\n{NODES}PrologFlags={flags}\n{timeout}")
    rt = Runtime(host, FakeGpu(), make_settings(readiness={"deadline_s": DEADLINE_S}, **sections),
                 structlog.get_logger())  # fmt: skip
    env = job_env(job_id=42, nodelist="gb[01-03]", SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO",
                  SLURM_JOB_RESTART_COUNT=restarts)  # fmt: skip
    try:
        return prolog(env, rt)
    except HealthTimeout as exc:
        return exc


def _drained(host: FakeHost) -> str | None:
    """gb01's reason if the prolog drained it."""
    node = host.slurm_nodes["gb01"]
    return node.get("reason") if "DRAIN" in node["state"].split("+") else None


def _asked(host: FakeHost) -> list[tuple[str, ...]]:
    """slurmctld's questions about the job (squeue)."""
    return [c for c in host.calls if c[0].endswith("squeue")]


def test_deferbatch_waits_for_the_requeue_and_drains_nothing(ctld: Slurmctld,
                                                              make_settings: Callable[..., Settings],
                                                              root: Path) -> None:  # fmt: skip
    """The requeue lands 3 s after the deadline: asked again until then, exit 0, no drain of this tray."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch")
    assert not isinstance(out, HealthTimeout), str(out)
    assert out.job_ended == "PENDING" and _drained(ctld) is None
    assert len(_asked(ctld)) >= 3 and ctld.now >= ctld.requeue_at


def test_without_deferbatch_one_question_as_before(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                    root: Path) -> None:  # fmt: skip
    """The batch script starts on the first tray once its own prolog ends: no waiting; fails and is drained."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    out = _prolog(ctld, make_settings, root, "Alloc")
    assert isinstance(out, HealthTimeout)
    assert len(_asked(ctld)) == 1 and _drained(ctld) == "imex:not_ready gb01 job 42: peers gb02 not ready"


@pytest.mark.parametrize("flags", ["Alloc,DeferBatch", "Alloc"])
@pytest.mark.parametrize(
    ("restarts", "job", "said"),
    [
        # a peer's slurmd never got the prolog: slurmctld declared it failed, requeued the job, and started
        # its next run before the deadline, elsewhere or on these very trays
        pytest.param("0", SlurmJob(42, "RUNNING", "gb[05-07]", restarts=1),
                     "RUNNING (requeued: restart count 1, this run's 0)", id="next-run-elsewhere"),
        pytest.param("0", SlurmJob(42, "CONFIGURING", "gb[01-03]", restarts=1),
                     "CONFIGURING (requeued: restart count 1, this run's 0)", id="next-run-here"),
        # slurmd did not say which run this is: the node list still tells
        pytest.param(None, SlurmJob(42, "RUNNING", "gb[05-07]", restarts=1),
                     "RUNNING on gb[05-07], not on this tray", id="no-count-elsewhere"),
    ],
)  # fmt: skip
def test_a_job_already_running_again_has_taken_this_run_back(make_settings: Callable[..., Settings], root: Path,
                                                              flags: str, restarts: str | None, job: SlurmJob,
                                                              said: str) -> None:  # fmt: skip
    """Issue 43: at the deadline, a healthy tray's peer was never set up because slurmctld had already requeued
    the job, which runs again (RUNNING or CONFIGURING: the next run). That run is not this prolog's: it exits 0
    at its first question, drains nothing and leaves nothing, whatever PrologFlags say."""
    host = _healthy(FakeHost(addresses=rack_addresses()))
    host.slurm_jobs[42] = job
    out = _prolog(host, make_settings, root, flags, restarts=restarts)
    assert not isinstance(out, HealthTimeout), str(out)
    assert out.job_ended == said and _drained(host) is None and _left_in(root) == []
    assert len(_asked(host)) == 1


@pytest.mark.parametrize("flags", ["Alloc,DeferBatch", "Alloc"])
def test_this_run_still_starting_keeps_the_failure(make_settings: Callable[..., Settings], root: Path,
                                                    flags: str) -> None:  # fmt: skip
    """The same run (restart count 0) on this tray, still CONFIGURING: the peer's fault is not yet Slurm's
    answer, so the tray fails as before (asked over the window under DeferBatch)."""
    host = _healthy(FakeHost(addresses=rack_addresses()))
    host.slurm_jobs[42] = SlurmJob(42, "CONFIGURING", "gb[01-03]", restarts=0)
    out = _prolog(host, make_settings, root, flags, restarts="0", slurm={"timeout_margin_s": 2})
    assert isinstance(out, HealthTimeout) and _drained(host)


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param("Alloc,DeferBatch,NoHold", id="nohold"),  # no WAIT_PROLOG: DeferBatch holds nothing
        pytest.param("Contain", id="no-deferbatch"),
    ],
)
def test_flags_that_do_not_hold_the_batch_script_ask_once(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                          root: Path, flags: str) -> None:  # fmt: skip
    """Only DeferBatch without NoHold makes slurmctld hold the batch script, and so makes waiting safe."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    assert isinstance(_prolog(ctld, make_settings, root, flags), HealthTimeout)
    assert len(_asked(ctld)) == 1


def test_no_requeue_fails_when_the_margin_is_used_up(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                      root: Path) -> None:  # fmt: skip
    """The job keeps RUNNING: questions over timeout_margin_s (backing off to 1 s), then the failure and drain."""
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch", slurm={"timeout_margin_s": 6})
    assert isinstance(out, HealthTimeout) and _drained(ctld)
    first = 1000.0 + DEADLINE_S  # the first question comes at the deadline (the fake's TCP look takes no time)
    assert first + 6 - 0.3 <= ctld.now <= first + 6 + 0.1
    assert 8 <= len(_asked(ctld)) <= 11


def test_the_hook_timeout_bounds_the_window(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                            root: Path) -> None:  # fmt: skip
    """PrologEpilogTimeout=12: the questions stop 2 x query_timeout_s + 1 s before it, whatever the margin."""
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch", "PrologEpilogTimeout=12\n",
                  slurm={"timeout_margin_s": 6, "query_timeout_s": 2})  # fmt: skip
    assert isinstance(out, HealthTimeout)
    assert ctld.now - 1000.0 <= 12 - 2 * 2 - 1 + 0.1


# ---------------------------------------------------------------- a tray sure of its own fault (issue 41)

#: the slow tray of a 4-tray job; every -N answer after the first two finds its peers' daemons stopped
SLOW_TRAY, PEERS = "gb04", "gb01,gb02,gb03"
LEFT_OUT = "imex:not_ready gb04 job 42: peers gb01,gb02,gb03 connected to each other, none to this tray"


def _left_behind(hosts: Sequence[str]) -> str:
    """A -N answer in which the other trays are READY and connected to each other, none of them yet to the last."""
    doc = json.loads(domain_json(hosts, status="DEGRADED"))
    for node in doc["nodes"].values():
        for conn in node["connections"].values():
            if hosts[-1] in (node["host"], conn["host"]):
                conn["status"] = "NEVER_CONNECTED"
    return json.dumps(doc)


@pytest.fixture
def slow() -> FakeHost:
    """gb04, the slow tray of gb[01-04] when the job is cancelled (issue 41): its first two -N answers show the
    others connected to each other and not yet to it; then their epilogs have stopped their daemons (UNAVAILABLE,
    command ports refused), so its view of the whole domain says "the others formed it without this tray"."""
    host = FakeHost(addresses=rack_addresses())
    answers = iter(range(10**6))

    def domain(hosts: list[str]) -> tuple[int, str]:
        if next(answers) < 2:
            return 0, _left_behind(hosts)
        gone = dict.fromkeys(range(len(hosts) - 1), "UNAVAILABLE")
        return 0, domain_json(hosts, status="DEGRADED", node_status=gone, conn_status="INVALID")

    host.domain = domain
    host.reach = {f"10.0.0.{i}": "refused" for i in (1, 2, 3)}
    host.incoming, host.outgoing = frozenset(), frozenset()
    host.slurm_nodes[SLOW_TRAY] = {"state": "ALLOCATED"}
    return host


def _slow_prolog(host: FakeHost, make_settings: Callable[..., Settings], root: Path, flags: str = "Alloc,DeferBatch",
                 restarts: str | None = "0", **sections: dict[str, Any]) -> Any:  # fmt: skip
    """Run gb04's prolog (SLURM_JOB_RESTART_COUNT ``restarts``); the result, or the HealthTimeout raised."""
    conf = root / "slurm.conf"
    conf.write_text(f"ClusterName=x\n{NODES}PrologFlags={flags}\n")
    s = make_settings(node=SLOW_TRAY, readiness={"deadline_s": DEADLINE_S}, **sections)
    env = job_env(job_id=42, nodelist="gb[01-04]", node=SLOW_TRAY, SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO",
                  SLURM_JOB_RESTART_COUNT=restarts)  # fmt: skip
    try:
        return prolog(env, Runtime(host, FakeGpu(), s, structlog.get_logger()))
    except HealthTimeout as exc:
        return exc


def _slow_drained(host: FakeHost) -> str | None:
    node = host.slurm_nodes[SLOW_TRAY]
    return node.get("reason") if "DRAIN" in node["state"].split("+") else None


def _left_in(root: Path) -> list[str]:
    return [str(p) for p in (root / "run/imexctl/jobs").glob("*")]


@pytest.mark.parametrize("flags", ["Alloc,DeferBatch", "Alloc,Contain"])
@pytest.mark.parametrize(
    "job",
    [
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]"), id="completing"),  # its epilogs still run
        pytest.param(SlurmJob(42, "CANCELLED", "gb[01-04]"), id="cancelled"),
        pytest.param(SlurmJob(42, "TIMEOUT", "gb[01-04]"), id="timed-out"),
    ],
)
def test_a_tray_left_behind_by_a_cancelled_job_drains_nothing(slow: FakeHost, make_settings: Callable[..., Settings],
                                                              root: Path, flags: str, job: SlurmJob) -> None:  # fmt: skip
    """Issue 41: the peers left because the job was cancelled, so the slow tray's view says "the others formed the
    domain without it", its own fault. It asks slurmctld once before it fails: the job is over, so it rolls back,
    logs prolog.job_ended (without blaming its ports) and exits 0; the node is not drained."""
    slow.slurm_jobs[42] = job
    with capture_logs() as logs:
        out = _slow_prolog(slow, make_settings, root, flags)
    assert not isinstance(out, HealthTimeout), str(out)
    assert out.job_ended == job.state and _slow_drained(slow) is None and _left_in(root) == []
    assert len(_asked(slow)) == 1
    (ended,) = [e for e in logs if e["event"] == "prolog.job_ended"]
    assert ended["job_state"] == job.state and "not ready" in ended["reason"], ended
    for blame in ("none of them to this tray", "check this tray", "firewall", "incoming"):
        assert blame not in ended["reason"], ended


@pytest.mark.parametrize(
    "job",
    [
        # another tray's prolog failed: slurmctld requeued the job (one more restart) while its trays complete
        pytest.param(SlurmJob(42, "COMPLETING", "gb[01-04]", restarts=1), id="completing-requeued"),
        pytest.param(SlurmJob(42, "PENDING", reason="launch_failed_requeued_held", restarts=1), id="pending"),
        pytest.param(SlurmJob(42, "REQUEUED", restarts=1), id="requeued"),
        pytest.param(SlurmJob(42, "REQUEUE_HOLD", reason="launch_failed_requeued_held", restarts=6), id="requeue-hold"),
        pytest.param(SlurmJob(42, "CONFIGURING", "gb[01-04]"), id="configuring"),
        pytest.param(SlurmJob(42, "RUNNING", "gb[01-04]"), id="running"),
        pytest.param(None, id="unknown-job"),
    ],
)
def test_a_tray_sure_of_its_own_fault_fails_while_the_job_may_run_again(
    slow: FakeHost, make_settings: Callable[..., Settings], root: Path, job: SlurmJob | None
) -> None:
    """A job back in the queue (another tray's failure requeued it), still starting, or unknown to slurmctld is
    no end: the tray sure of its own fault fails as before, with its own reason, after one question (under
    DeferBatch too: it never waits, so its own failure reaches slurmctld first and its peers see the requeue)."""
    if job is not None:
        slow.slurm_jobs[42] = job
    out = _slow_prolog(slow, make_settings, root)
    assert isinstance(out, HealthTimeout) and out.isolated, str(out)
    assert _slow_drained(slow) == LEFT_OUT and _left_in(root) == []
    assert len(_asked(slow)) == 1
    assert slow.now - 1000.0 <= DEADLINE_S + 0.5, "the tray sure of its own fault waited for slurmctld"


@pytest.mark.parametrize(("state", "exits_0"), [("COMPLETING", False), ("CANCELLED", True)])
def test_without_a_restart_count_completing_proves_nothing(slow: FakeHost, make_settings: Callable[..., Settings],
                                                           root: Path, state: str, exits_0: bool) -> None:  # fmt: skip
    """slurmd did not say which run this is (no SLURM_JOB_RESTART_COUNT): COMPLETING may be a requeue in
    progress, so the tray sure of its own fault fails; CANCELLED is an end whatever the run."""
    slow.slurm_jobs[42] = SlurmJob(42, state, "gb[01-04]")
    out = _slow_prolog(slow, make_settings, root, restarts=None)
    assert isinstance(out, HealthTimeout) is not exits_0, str(out)
    assert (_slow_drained(slow) is None) is exits_0


def test_slurmctld_that_does_not_answer_keeps_the_failure(slow: FakeHost, make_settings: Callable[..., Settings],
                                                          root: Path) -> None:  # fmt: skip
    """squeue hangs: one question bounded by query_timeout_s, then the failure and the drain as before."""
    slow.squeue_hangs = True
    slow.slurm_jobs[42] = SlurmJob(42, "CANCELLED", "gb[01-04]")
    out = _slow_prolog(slow, make_settings, root, slurm={"query_timeout_s": 2})
    assert isinstance(out, HealthTimeout) and _slow_drained(slow) == LEFT_OUT
    assert len(_asked(slow)) == 1 and slow.now - 1000.0 <= DEADLINE_S + 2 + 0.5


def test_check_cancelled_off_asks_nobody(slow: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
    """[slurm] check_cancelled = no: no question, the tray sure of its own fault fails as before."""
    slow.slurm_jobs[42] = SlurmJob(42, "CANCELLED", "gb[01-04]")
    out = _slow_prolog(slow, make_settings, root, slurm={"check_cancelled": "no"})
    assert isinstance(out, HealthTimeout) and _slow_drained(slow) == LEFT_OUT and not _asked(slow)


@pytest.mark.parametrize(("job", "exits_0"), [
    (SlurmJob(42, "COMPLETING", "gb[01-04]"), True),
    (SlurmJob(42, "COMPLETING", "gb[01-04]", restarts=1), False),
    (SlurmJob(42, "PENDING", restarts=1), False),
])  # fmt: skip
def test_an_own_daemon_waiting_for_peers_that_left_asks_too(slow: FakeHost, make_settings: Callable[..., Settings],
                                                            root: Path, job: SlurmJob, exits_0: bool) -> None:  # fmt: skip
    """With [imex] IMEX_WAIT_FOR_QUORUM = FULL the slow tray's daemon waits for peers that the cancel took away, and
    never gets READY: the same race, so the same one question; a requeue is no end."""
    slow.ready_after = 10**6
    slow.slurm_jobs[42] = job
    out = _slow_prolog(slow, make_settings, root, imex={"IMEX_WAIT_FOR_QUORUM": "FULL"})
    assert (not isinstance(out, HealthTimeout) and out.job_ended == job.state) is exits_0, str(out)
    assert len(_asked(slow)) == 1
    if not exits_0:
        assert isinstance(out, HealthTimeout) and not out.local_ready
        assert _slow_drained(slow) == "imex:not_ready gb04 job 42: own daemon not ready (WAITING_FOR_PEERS)"


#: every word squeue prints for a job's state (``job_state_string()``, src/common/slurm_protocol_defs.c; flags
#: first, so COMPLETING hides whether the job ended or went back to the queue), and what it means here:
#: (a healthy tray may exit 0: the job will not run on this allocation; a tray sure of its own fault may exit 0:
#: the job is over, not merely back in the queue).  EXPEDITING (26.05) is also shown by a requeued job that
#: runs again until its batch launch; RESV_DEL_HOLD only by a pending one, but it is not counted (yet).
STATES = {
    "PENDING": (True, False), "REQUEUED": (True, False), "REQUEUE_HOLD": (True, False),
    "REQUEUE_FED": (True, False), "SPECIAL_EXIT": (True, False), "REVOKED": (True, False),
    "COMPLETING": (True, True),  # with the restart count this run started with: no requeue since
    "CANCELLED": (True, True), "COMPLETED": (True, True), "FAILED": (True, True), "TIMEOUT": (True, True),
    "NODE_FAIL": (True, True), "PREEMPTED": (True, True), "BOOT_FAIL": (True, True), "DEADLINE": (True, True),
    "OUT_OF_MEMORY": (True, True),
    "CONFIGURING": (False, False), "RUNNING": (False, False), "RESIZING": (False, False),
    "SIGNALING": (False, False), "STAGE_OUT": (False, False), "SUSPENDED": (False, False),
    "STOPPED": (False, False), "EXPEDITING": (False, False), "RESV_DEL_HOLD": (False, False),
}  # fmt: skip


@pytest.mark.parametrize("state", sorted(STATES))
def test_what_each_job_state_means_to_each_tray(slow: FakeHost, make_settings: Callable[..., Settings], root: Path,
                                                state: str) -> None:  # fmt: skip
    """A healthy tray (its peer gb02 not ready) exits 0 for any state in which the job will not run on this
    allocation, requeues included (REQUEUE_HOLD: held after repeated launch failures, job_mgr.c
    _handle_requeue_limit); the tray sure of its own fault only for a job that is over."""
    taken_back, over = STATES[state]
    host = _healthy(FakeHost(addresses=rack_addresses()))
    host.slurm_jobs[42] = SlurmJob(42, state, "gb[01-03]")
    healthy = _prolog(host, make_settings, root, "Alloc")
    assert (not isinstance(healthy, HealthTimeout) and healthy.job_ended == state) is taken_back, str(healthy)
    slow.slurm_jobs[42] = SlurmJob(42, state, "gb[01-04]")
    own = _slow_prolog(slow, make_settings, root, "Alloc")
    assert (not isinstance(own, HealthTimeout) and own.job_ended == state) is over, str(own)
