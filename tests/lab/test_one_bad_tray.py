"""One broken tray drains one tray, under the README's ``PrologFlags=Alloc,DeferBatch`` (issue 34 §5).

node2's daemon never gets ready. Its prolog fails at the deadline and drains node2 with its own reason;
the healthy trays, whose daemons are READY, keep asking slurmctld until the requeue that node2's failure
causes has landed (``[slurm] check_cancelled`` under DeferBatch), then roll back and exit 0: they stay
idle. What Slurm does with the job, seen on 22.05, 24.11 and 26.05 alike: it requeues it held
(``launch_failed_requeued_held``: ``_launch_job_fail`` asks for ``JOB_REQUEUE_HOLD | JOB_LAUNCH_FAILED``
unless ``SchedulerParameters=nohold_on_prolog_fail``), and the batch script never starts (slurmctld holds
it until every prolog reported and drops it for a requeued job). Released, it runs on other trays, once
the first run's credential has expired (2 minutes after the requeue, as slurmctld schedules it).

The readiness deadline is 10 s so that the lab's ``PrologEpilogTimeout=30`` leaves the whole
``timeout_margin_s`` (10 s) for the questions.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    CRED_LIFETIME_S,
    JOB_TIMEOUT,
    UID,
    events,
    imexctl_settings,
    leftovers,
    sbatch,
    wait_done,
    wait_prolog_rpcs_settled,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

BAD = "node2"
SETTINGS = {"readiness": {"deadline_s": "10"}}


def _held(lab: SlurmLab, job: int) -> dict[str, str]:
    def held() -> dict[str, str] | None:
        rec = lab.job(job)
        return rec if rec.get("JobState") == "PENDING" and rec.get("Reason") == "launch_failed_requeued_held" else None

    return wait_for(held, JOB_TIMEOUT, 0.5, what=f"job {job} to be requeued and held")


def _summaries(lab: SlurmLab, job: int, nodes: list[str]) -> dict[str, dict[str, Any]]:
    def ended() -> dict[str, dict[str, Any]] | None:
        done = {n: events(lab, n, job, "prolog.done") for n in nodes}
        return {n: d[-1] for n, d in done.items()} if all(done.values()) else None

    return wait_for(ended, JOB_TIMEOUT, 0.5, what=f"the prologs of job {job}")


def _only_the_bad_tray_drained(lab: SlurmLab, job: int, nodes: list[str]) -> None:
    done = _summaries(lab, job, nodes)
    assert done[BAD]["ok"] is False and done[BAD]["error_code"] == "not_ready", done[BAD]
    for node in nodes:
        if node != BAD:  # waited for the requeue, rolled back, exit 0
            assert done[node]["ok"] is True and done[node].get("job_ended"), f"{node}: {done[node]}"
            assert events(lab, node, job, "prolog.rolled_back"), f"{node}: no roll-back before exit 0"
    wait_for(lambda: not lab.run(["squeue", "-h", "-t", "CG"], check=False).stdout.strip(), 30, 0.5, what="epilogs")
    states = lab.node_states()
    assert states[BAD]["state"].startswith("drain"), states
    assert states[BAD]["reason"] == f"imex:not_ready {BAD} job {job}: own daemon not ready (WAITING_FOR_PEERS)", states
    shown = lab.run(["scontrol", "show", "node", BAD]).stdout  # what slurmdbd gets too: the whole reason
    assert f"Reason=imex:not_ready {BAD} job {job}: own daemon not ready (WAITING_FOR_PEERS) [root@" in shown, shown
    assert all(states[n]["state"] == "idle" for n in NODES if n != BAD), states
    for node in nodes:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back"


def test_a_never_ready_tray_in_a_4_tray_job_drains_only_itself(lab: SlurmLab) -> None:
    """4 trays, node2 never ready: node2 drained with its reason, the other 3 exit 0 and stay idle, the job held."""
    lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
    marker = lab.dir / "out" / "one-bad-tray-ran"
    with imexctl_settings(lab, SETTINGS):
        job = sbatch(lab, f"touch {marker}.$SLURM_RESTART_COUNT", NODES)
        info = _held(lab, job)
        _only_the_bad_tray_drained(lab, job, list(NODES))
    assert info.get("Restarts") == "1", info
    assert not list(marker.parent.glob(marker.name + ".*")), "the batch script ran on a domain that was not UP"
    lab.run(["scancel", str(job)], check=False)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
    lab.faults.write_text("")
    lab.run(["scontrol", "update", f"nodename={BAD}", "state=resume"])
    lab.wait_idle()


def test_the_requeued_job_runs_on_other_trays_once_released(lab: SlurmLab) -> None:
    """3 trays of 4 (Slurm picks node1-3): node2 drained alone; released, the job runs on node1,node3,node4."""
    lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
    marker = lab.dir / "out" / "one-bad-tray-elsewhere"
    with imexctl_settings(lab, SETTINGS):
        argv = ["sbatch", "--parsable", "-N", "3", "-t", "5", "-o", f"{lab.dir}/out/%j.out"]
        out = lab.run([*argv, "--wrap", f"touch {marker}.$SLURM_RESTART_COUNT"], user=UID, timeout=30)
        job = int(out.stdout.strip().split(";")[0])
        first = _held(lab, job)
        _only_the_bad_tray_drained(lab, job, ["node1", "node2", "node3"])
        wait_prolog_rpcs_settled(lab, job)  # a late resend would fail the released job's new run (jobs.py)
        lab.run(["scontrol", "release", str(job)])
        # not StartTime=now: slurmctld starts a requeued job no sooner than its first run's credential expired
        # (batch_requeue_fini: begin = requeue + the credential's lifetime, 120 s, + 1), and earlier the slurmd of
        # a tray of both runs may still hold that credential revoked and run no prolog (seen on 24.11)
        info = wait_done(lab, job, timeout=CRED_LIFETIME_S + 60)
    assert first.get("Restarts") == "1" and info.get("Restarts") == "1", (first, info)
    assert info.get("NodeList") == "node[1,3-4]", info
    assert marker.with_name(marker.name + ".1").exists() and not marker.with_name(marker.name + ".0").exists()
    lab.faults.write_text("")
    lab.run(["scontrol", "update", f"nodename={BAD}", "state=resume"])
    lab.wait_idle()
