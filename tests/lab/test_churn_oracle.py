"""The churn's oracle and plan on made-up evidence, without a lab (issue 43): each check finds what is planted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.lab.churn import (
    Drain,
    Evidence,
    Fault,
    JobRun,
    Mix,
    PlannedJob,
    Script,
    channel_findings,
    drain_findings,
    job_findings,
    leftover_findings,
    make_plan,
    oracle,
    script_findings,
)

TRAYS = [f"node{i}" for i in range(1, 13)]
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


@pytest.fixture
def fresh() -> None:
    """No lab here: this replaces the lab tests' per-test reset of the shared lab (conftest.py), which needs one."""


def _ts(t: float) -> str:
    """imexctl's timestamp of ``T0 + t``."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(T0 + t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _rec(event: str, job: int, t: float, **fields: Any) -> dict[str, Any]:
    return {"event": event, "job_id": job, "timestamp": _ts(t), **fields}


def _up(job: int, t: float, trays: int, minor: int, clique: str = "block b1") -> list[dict[str, Any]]:
    """A tray's records of a job that got its domain at ``t`` and ended 10 s later."""
    return [
        _rec("imex.daemon.started", job, t),
        _rec("device.channel.created", job, t + 1, minor=minor, clique=clique),
        _rec("prolog.done", job, t + 1.5, ok=True, ready=True, trays=trays),
        _rec("epilog.done", job, t + 10, ok=True),
    ]


def _domain(trays: int, status: str = "UP") -> dict[str, Any]:
    conns = {str(i): {"status": "CONNECTED"} for i in range(trays)}
    return {"status": status, "nodes": {str(i): {"status": "READY", "connections": conns} for i in range(trays)}}


# -- the plan


def test_the_plan_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    """make_plan is repeatable, and a seed changes it."""
    mix = Mix(fault_rate=0.1, cancel_rate=0.1, time_limit_rate=0.05, requeue_rate=0.05)
    assert make_plan(7, TRAYS, 200, mix) == make_plan(7, TRAYS, 200, mix)
    assert make_plan(7, TRAYS, 200, mix) != make_plan(8, TRAYS, 200, mix)


def test_the_plan_has_its_shares_of_faults_and_sizes_in_range() -> None:
    """10 % faults of both kinds; never_ready jobs name a tray and have a peer; no job beyond ``largest``."""
    plan = make_plan(3, TRAYS, 200, Mix(fault_rate=0.1), largest=8)
    faults = [p for p in plan if p.fault]
    assert len(faults) == 20 and {p.fault for p in faults} == {"never_ready", "kill_daemon"}
    assert all(p.tray in TRAYS and p.size >= 2 for p in faults if p.fault == "never_ready")
    assert all(not (p.cancel or p.time_limit or p.requeue) for p in faults)
    assert {p.size for p in plan} <= set(range(1, 9)) and max(p.size for p in plan) == 8
    assert any(p.cancel for p in plan) and any(p.time_limit for p in plan)


# -- drains


def test_the_faulted_tray_drained_with_its_code_is_no_finding() -> None:
    """never_ready met by job 12 on node3, drained with imex:not_ready node3 job 12: nothing to report."""
    fault = Fault("never_ready", "node3", T0, cleared=T0 + 30)
    drain = Drain("node3", "drng", "imex:not_ready node3 job 12: own daemon not ready (WAITING_FOR_PEERS)", T0 + 30)
    events = {"node3": [_rec("imex.daemon.started", 12, 5)]}
    assert drain_findings([fault], [drain], events) == []


def test_a_daemon_started_just_before_the_fault_was_armed_may_meet_it() -> None:
    """Job 12's daemon started 2 s before never_ready was armed and read it a moment later: its drain is the
    fault's; a daemon started 10 s before cannot have, and its drain is reported. Not drained, neither counts."""
    fault = Fault("never_ready", "node3", T0, cleared=T0 + 30)
    drain = Drain("node3", "drng", "imex:not_ready node3 job 12: own daemon not ready (WAITING_FOR_PEERS)", T0 + 30)
    assert drain_findings([fault], [drain], {"node3": [_rec("imex.daemon.started", 12, -2)]}) == []
    (found,) = drain_findings([fault], [drain], {"node3": [_rec("imex.daemon.started", 12, -10)]})
    assert (found.job, found.tray) == (12, "node3") and "started no daemon there" in found.fact
    assert (
        drain_findings([Fault("never_ready", "node3", T0)], [], {"node3": [_rec("imex.daemon.started", 12, -2)]}) == []
    )


def test_a_healthy_tray_drained_is_a_finding_naming_job_and_tray() -> None:
    """node4 drained without a fault (a peer of the faulted job): reported with its job, tray and reason."""
    fault = Fault("never_ready", "node3", T0, cleared=T0 + 30)
    drains = [
        Drain("node3", "drng", "imex:not_ready node3 job 12: own daemon not ready", T0 + 30),
        Drain("node4", "drng", "imex:not_ready node4 job 12: peers node3 not ready", T0 + 31),
    ]
    events = {"node3": [_rec("imex.daemon.started", 12, 5)]}
    (found,) = drain_findings([fault], drains, events)
    assert (found.job, found.tray) == (12, "node4") and "without a fault" in found.fact, found
    assert str(found).startswith("job 12 tray node4: ") and "peers node3 not ready" in str(found)


def test_a_faulted_tray_drained_with_another_code_or_job_is_a_finding() -> None:
    """A killed daemon's tray drained as Slurm's 'Epilog error', or for another job: each reported."""
    fault = Fault("kill_daemon", "node5", T0, job=40)
    (wrong_code,) = drain_findings([fault], [Drain("node5", "drain", "Epilog error", T0 + 9)], {})
    assert (wrong_code.job, wrong_code.tray) == (40, "node5") and "'imex:daemon_lost node5 job '" in wrong_code.fact
    other = Drain("node5", "drain", "imex:daemon_lost node5 job 41: the IMEX daemon ended", T0 + 9)
    (wrong_job,) = drain_findings([fault], [other], {})
    assert (wrong_job.job, wrong_job.tray) == (41, "node5") and "killed in job 40" in wrong_job.fact


def test_a_fault_met_without_a_drain_is_a_finding_unless_the_job_was_cancelled_in_its_prolog() -> None:
    """never_ready met by job 12 and no drain: a finding; the same job cancelled in its prologs: none.
    A killed daemon without a drain: a finding."""
    fault = Fault("never_ready", "node3", T0, cleared=T0 + 60)
    events = {"node3": [_rec("imex.daemon.started", 11, -5), _rec("imex.daemon.started", 12, 5)]}
    (found,) = drain_findings([fault], [], events)
    assert (found.job, found.tray) == (12, "node3") and "never ready" in found.fact
    assert drain_findings([fault], [], events, cancelled_in_prolog=[12]) == []
    (lost,) = drain_findings([Fault("kill_daemon", "node6", T0, job=50)], [], {})
    assert (lost.job, lost.tray) == (50, "node6") and "not drained" in lost.fact


def test_a_drain_after_the_fault_was_cleared_is_a_healthy_drain() -> None:
    """The same tray drained again after its fault was cleared and it was resumed: a tray without a fault."""
    fault = Fault("never_ready", "node3", T0, cleared=T0 + 30)
    drains = [
        Drain("node3", "drng", "imex:not_ready node3 job 12: own daemon not ready", T0 + 30),
        Drain("node3", "drain", "Prolog error", T0 + 80),
    ]
    (found,) = drain_findings([fault], drains, {"node3": [_rec("imex.daemon.started", 12, 5)]})
    assert (found.job, found.tray) == (None, "node3") and "'Prolog error'" in found.fact


# -- leftovers


def test_a_planted_leftover_is_a_finding_with_its_job() -> None:
    """A job directory and a daemon left on node2: two findings naming job 77 and node2; a clean tray: none."""
    left = {
        "node1": [],
        "node2": [
            "job dir /tmp/imxch-x/nodes/node2/run/imexctl/jobs/77",
            "daemon pid 4242: nvidia-imex-sim -c /tmp/imxch-x/nodes/node2/run/imexctl/jobs/77/config.cfg",
            "channel /tmp/imxch-x/nodes/node2/dev/nvidia-caps-imex-channels/channel9",
        ],
    }
    found = leftover_findings(left)
    assert [(f.job, f.tray) for f in found] == [(77, "node2"), (77, "node2"), (None, "node2")], found
    assert "channel9" in found[2].fact


# -- channels


def test_two_domains_alive_at_once_in_one_clique_with_one_number_are_a_finding() -> None:
    """Job 20 on node1 and job 22 on node2 overlap in block b1 with channel 3: reported; in another block, or
    one after the other, or with other numbers: not."""
    events = {"node1": _up(20, 0, 2, 3), "node2": _up(22, 5, 2, 3)}
    (found,) = channel_findings(events)
    assert (found.job, found.tray) == (22, "node2") and "channel 3" in found.fact and "job 20" in found.fact
    assert channel_findings({"node1": _up(20, 0, 2, 3), "node2": _up(22, 5, 2, 3, clique="block b2")}) == []
    assert channel_findings({"node1": _up(20, 0, 2, 3), "node2": _up(22, 11, 2, 3)}) == []
    assert channel_findings({"node1": _up(20, 0, 2, 3), "node2": _up(22, 5, 2, 4)}) == []


def test_a_domain_never_torn_down_overlaps_every_later_one() -> None:
    """Job 20's channel on node1 with no epilog: a later job with its number in the clique is reported."""
    events = {"node1": _up(20, 0, 2, 3)[:3], "node2": _up(22, 100, 2, 3)}
    (found,) = channel_findings(events)
    assert found.job == 22 and "never torn down" in found.fact


# -- scripts and jobs


def test_a_script_that_ran_before_its_domain_was_up_is_a_finding() -> None:
    """Job 30 on node1,node2: node2's prolog ended after the script started, node1's failed: both reported; the
    domain seen DEGRADED from the script's tray is reported too."""
    good = Script(30, 0, T0 + 5, "node1", ["node1", "node2"], _domain(2))
    events = {"node1": _up(30, 0, 2, 3), "node2": _up(30, 0, 2, 3)}
    assert script_findings([good], events) == []
    late = {"node1": _up(30, 0, 2, 3), "node2": _up(30, 4, 2, 3)}
    (found,) = script_findings([good], late)
    assert (found.job, found.tray) == (30, "node2") and "before any prolog ended" in found.fact
    failed = {"node1": [_rec("prolog.done", 30, 1, ok=False, error_code="not_ready")], "node2": _up(30, 0, 2, 3)}
    (found,) = script_findings([good], failed)
    assert (found.job, found.tray) == (30, "node1") and "without a domain" in found.fact
    degraded = Script(30, 0, T0 + 5, "node1", ["node1", "node2"], _domain(2, "DEGRADED"))
    (found,) = script_findings([degraded], events)
    assert (found.job, found.tray) == (30, "node1") and "DEGRADED" in found.fact


def test_a_missing_domain_snapshot_is_a_finding_unless_the_driver_cancelled_the_job() -> None:
    """Job 30's script left no snapshot of its domain: a finding; cancelled by the driver while its script ran
    (before the snapshot was written): none. A DEGRADED snapshot of a cancelled job is still a finding."""
    events = {"node1": _up(30, 0, 2, 3), "node2": _up(30, 0, 2, 3)}
    lost = Script(30, 0, T0 + 5, "node1", ["node1", "node2"], None, "no domain-<job> record")
    (found,) = script_findings([lost], events)
    assert (found.job, found.tray) == (30, "node1") and "no domain-<job> record" in found.fact
    assert script_findings([lost], events, interrupted=[30]) == []
    degraded = Script(30, 0, T0 + 5, "node1", ["node1", "node2"], _domain(2, "DEGRADED"))
    assert len(script_findings([degraded], events, interrupted=[30])) == 1


def test_a_job_not_cancelled_that_never_ran_its_script_is_a_finding() -> None:
    """Job 31 FAILED without a script: reported; job 32 cancelled by the driver: not."""
    runs = [
        JobRun(PlannedJob(0, 2, 1), 31, T0, nodes=["node1", "node2"], state="FAILED", reason="NonZeroExitCode"),
        JobRun(PlannedJob(1, 1, 1, cancel=True), 32, T0, state="CANCELLED", cancelled="prolog"),
    ]
    (found,) = job_findings(runs, [])
    assert (found.job, found.tray) == (31, "node1,node2") and "FAILED" in found.fact


def test_the_oracle_collects_every_kind_of_finding() -> None:
    """oracle() over evidence with one of each planted fault reports all of them."""
    ev = Evidence(
        trays=TRAYS,
        runs=[JobRun(PlannedJob(0, 1, 1), 31, T0, nodes=["node9"], state="FAILED", reason="x")],
        faults=[],
        drains=[Drain("node4", "drain", "imex:not_ready node4 job 12: peers node3 not ready", T0)],
        events={"node1": _up(20, 0, 2, 3), "node2": _up(22, 5, 2, 3)},
        scripts=[],
        left={"node2": ["job dir /x/nodes/node2/run/imexctl/jobs/77"]},
    )
    assert sorted((f.job, f.tray) for f in oracle(ev)) == [(12, "node4"), (22, "node2"), (31, "node9"), (77, "node2")]
