"""A prolog that fails under real Slurm: roll back everywhere, drain, requeue held, and recover after repair."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    CRED_LIFETIME_S,
    PROLOG_TIMEOUT,
    events,
    imexctl_admin,
    leftovers,
    sbatch,
    wait_done,
    wait_prolog_rpcs_settled,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm


def test_prolog_failure_rolls_back_drains_requeues_and_recovers(lab: SlurmLab) -> None:
    """A daemon that never gets ready fails the prolog: rollback, drain, requeue held; after repair the job runs."""
    bad = "node2"
    lab.faults.write_text(f"@{lab.addr(bad)} never_ready\n")
    marker = lab.dir / "out" / "prolog-failure-ran"
    job = sbatch(lab, f"touch {marker}.$SLURM_RESTART_COUNT", NODES)

    def held() -> dict[str, str] | None:
        rec = lab.job(job)
        held = rec.get("JobState") == "PENDING" and rec.get("Reason") == "launch_failed_requeued_held"
        return rec if held else None

    info = wait_for(held, PROLOG_TIMEOUT + 30, what=f"job {job} to be requeued and held")
    assert info["JobState"] == "PENDING" and info.get("Restarts") == "1", info
    states = lab.node_states()
    # the tray drained itself with its own reason first, and slurmctld kept it (issue 34)
    want = f"imex:not_ready {bad} job {job}: own daemon not ready (WAITING_FOR_PEERS)"
    assert states[bad]["state"].startswith("drain") and states[bad]["reason"] == want, states
    # by default ([readiness] blame_peers = no) every tray fails, so the batch script never starts
    assert not list(marker.parent.glob(marker.name + ".*")), "the batch script ran on a domain that was not UP"
    # The broken tray always fails and is drained. Each healthy tray (its own daemon READY) either fails
    # too, naming the broken one, or, when slurmctld has already taken the job back for the requeue by
    # the time it asks ([slurm] check_cancelled), rolls back and exits 0 without a drain.
    drained = [bad]
    for node in sorted(set(NODES) - {bad}):
        done = wait_for(lambda: events(lab, node, job, "prolog.done"), 30, what=f"{node}'s prolog summary")
        last = done[-1]
        if last.get("ok"):
            assert last.get("job_ended") in ("COMPLETING", "PENDING", "REQUEUED"), f"{node}: {done}"
        else:
            assert f"not ready: {lab.addr(bad)}" in last.get("reason", ""), f"{node}: {done}"
            drained.append(node)
    wait_for(lambda: all(lab.node_states()[n]["state"].startswith("drain") for n in drained), 30, what="drains")
    assert not [n for n in NODES if n not in drained and lab.node_states()[n]["state"].startswith("drain")]
    states = lab.node_states()
    for node in drained[1:]:  # a healthy tray that failed names the broken one by its node name
        assert states[node]["reason"].startswith(f"imex:not_ready {node} job {job}: peers {bad} not ready"), states
    # the epilog runs too after a failed prolog; wait for the nodes to stop completing, then nothing may remain
    wait_for(lambda: not lab.run(["squeue", "-h", "-t", "CG"], check=False).stdout.strip(), 30, what="epilogs")
    for node in NODES:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back after the failed prolog"
    assert events(lab, bad, job, "prolog.rolled_back"), f"{bad}: imexctl logged no rollback for job {job}"

    lab.faults.write_text("")
    res = imexctl_admin(lab, bad, "cleanup", check=False)
    assert res.returncode == 0, f"imexctl cleanup on {bad} failed ({res.returncode}): {res.stdout}{res.stderr}"
    for node in drained:
        lab.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    lab.wait_idle()
    wait_prolog_rpcs_settled(lab, job)  # a late resend would fail the released job's new run (jobs.py)
    # the safe recovery of troubleshooting.md: resume the trays, release the job, and let slurmctld start it when
    # the first run's credential has expired; StartTime=now could start it sooner, on slurmds that still hold that
    # credential revoked and run no prolog, so without its domain
    lab.run(["scontrol", "release", str(job)])
    info = wait_done(lab, job, timeout=CRED_LIFETIME_S + 60)
    assert info.get("Restarts") == "1" and Path(f"{marker}.1").exists(), info
    for node in NODES:  # the second run set up its domain on every tray (a healthy tray's first run may be ok too)
        setups = [e for e in events(lab, node, job, "prolog.done") if e.get("ok") and not e.get("job_ended")]
        assert setups, f"{node}: no prolog set the released job's domain up: {events(lab, node, job, 'prolog.done')}"
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after the recovered job {job}"
