"""Jobs that live through a slurmd restart or a requeue (issue 9: lock in what works).

- slurmd killed with SIGKILL mid-job and started again: the job and its domain go on, the job
  finishes, and the epilog cleans up.
- ``scontrol requeue`` of a running job: the epilog tears the first run down, then the new run's
  prolog sets up a fresh domain.
- the same job's prolog run a second time on a tray while the first waits for the domain (issue 32; a
  slurmd restarted during a prolog may run it again): the second keeps the first's finished domain
  (``imex.domain.kept``) and never tears it down under its peers.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    IMEXCTL,
    assert_domain_up,
    ctl_domain,
    events,
    hold_script,
    leftovers,
    prolog_processes,
    release,
    sbatch,
    sim_processes,
    wait_done,
    wait_started,
    wait_state,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

JOB_NODES = NODES[:2]
VICTIM = JOB_NODES[1]
CRED_EXPIRE = 10
#: how long the victim's daemon takes to come up: its prolog waits in readiness meanwhile
SLOW_START_S = 4


def test_slurmd_killed_and_restarted_mid_job(lab: SlurmLab) -> None:
    """SIGKILL to slurmd while a job runs, then a new slurmd: the domain stays, the job ends, nothing is left."""
    job = sbatch(lab, hold_script(lab), JOB_NODES)
    wait_started(lab, job)
    daemons = sim_processes(lab, VICTIM, job)
    assert len(daemons) == 1, daemons
    lab.kill_slurmd(VICTIM)
    assert sim_processes(lab, VICTIM, job) == daemons, "the job's daemon died with slurmd"
    lab.start_slurmd(VICTIM)
    wait_for(lambda: lab.node_states()[VICTIM]["state"] == "alloc", 30, 0.2, what=f"{VICTIM} back, allocated")
    assert_domain_up(ctl_domain(lab, VICTIM, job), len(JOB_NODES), f"job {job} after {VICTIM}'s slurmd restart")
    assert lab.job(job)["JobState"] == "RUNNING"
    release(lab, job)
    wait_done(lab, job)
    for node in JOB_NODES:
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert all(lab.node_states()[n]["state"] == "idle" for n in JOB_NODES), lab.node_states()


@pytest.fixture
def short_cred_expire(lab: SlurmLab) -> Iterator[None]:
    """The lab with ``AuthInfo=cred_expire=CRED_EXPIRE``: a requeued job may start again that soon.

    slurm.conf(5): cred_expire "also controls how long a requeued job must wait before starting again"
    (120 s by default). Forcing the new run earlier (``scontrol update StartTime=now``) was seen to start it
    with no prolog on a node that still held the job's credential: the run then has no IMEX domain there.
    """
    before = lab.extra_conf, dict(lab.extra_etc)
    lab.restart(before[0] + f"AuthInfo=cred_expire={CRED_EXPIRE}\n", before[1])
    try:
        yield
    finally:
        lab.restart(*before)


def test_requeue_of_a_running_job_tears_down_then_sets_up_afresh(lab: SlurmLab, short_cred_expire: None) -> None:
    """scontrol requeue: the epilog removes the first run's domain, the second run's prolog makes a new one."""
    job = sbatch(lab, hold_script(lab), JOB_NODES)
    wait_started(lab, job)
    first = {n: sim_processes(lab, n, job) for n in JOB_NODES}
    (lab.dir / "out" / f"started-{job}").unlink()
    lab.run(["scontrol", "requeue", str(job)])
    wait_for(lambda: all(events(lab, n, job, "epilog.done") for n in JOB_NODES), 30, 0.2, what="the first epilogs")
    for node in JOB_NODES:
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job} was requeued"
    wait_state(lab, job, ["PENDING"], 30)
    # the new run starts once the credential lifetime has passed, as Slurm intends
    info = wait_started(lab, job, timeout=CRED_EXPIRE + 60)
    assert info.get("Restarts") == "1", info
    assert info.get("NodeList") == "node[1-2]", f"job {job} restarted on {info.get('NodeList')}"
    for node in JOB_NODES:
        assert len(events(lab, node, job, "prolog.done")) == 2, f"{node}: {events(lab, node, job, 'prolog.done')}"
        assert events(lab, node, job, "prolog.done")[-1]["ok"] is True
        assert_domain_up(ctl_domain(lab, node, job), len(JOB_NODES), f"job {job}'s second run on {node}")
        assert sim_processes(lab, node, job) != first[node], f"{node}: the first run's daemon is still there"
    release(lab, job)
    wait_done(lab, job)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_a_prolog_run_again_for_the_same_job_keeps_its_domain(lab: SlurmLab) -> None:
    """The tray's prolog runs a second time for the same job, with slurmd's environment, while the first waits
    for the domain (as a slurmd restarted during a prolog would run it again): the second waits for the node
    lock, finds the first's finished domain of this run and exits 0 without touching it; the daemon the first
    started is the one the job runs with, the domain is UP on both trays, the job ends and nothing is left."""
    lab.faults.write_text(f"@{lab.addr(VICTIM)} slow_start={SLOW_START_S}\n")
    job = sbatch(lab, hold_script(lab), JOB_NODES)
    first: list[dict[str, Any]] = []

    def victim_waits() -> bool:
        first[:] = [p for p in prolog_processes(job) if p["env"].get("SLURMD_NODENAME") == VICTIM]
        return bool(first and events(lab, VICTIM, job, "imex.daemon.started"))

    wait_for(victim_waits, 60, 0.05, what=f"{VICTIM}'s prolog of job {job} waiting for its domain")
    assert not events(lab, VICTIM, job, "prolog.done"), "the prolog ended before it was run again"
    again: list[subprocess.CompletedProcess[str]] = []
    env = {k: v for k, v in first[0]["env"].items() if k != "PATH"}
    second = threading.Thread(
        target=lambda: again.append(lab.node_exec(VICTIM, [str(IMEXCTL), "prolog"], check=False, timeout=90, env=env))
    )
    second.start()
    wait_started(lab, job)
    second.join(120)
    assert again and again[0].returncode == 0, again
    done = events(lab, VICTIM, job, "prolog.done")
    assert len(done) == 2 and all(d["ok"] is True for d in done), done
    mine = [e["event"] for e in events(lab, VICTIM, job)]
    assert mine.count("imex.daemon.started") == 1 and mine.count("imex.domain.kept") == 1, mine
    assert "state.removed" not in mine and "imex.daemon.stopped" not in mine, mine
    assert len(sim_processes(lab, VICTIM, job)) == 1
    for node in JOB_NODES:
        assert_domain_up(ctl_domain(lab, node, job), len(JOB_NODES), f"job {job} on {node}, its prolog run twice")
    release(lab, job)
    wait_done(lab, job)
    for node in JOB_NODES:
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert all(lab.node_states()[n]["state"] == "idle" for n in JOB_NODES), lab.node_states()
