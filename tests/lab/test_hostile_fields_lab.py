"""Jobs whose name, comment, paths and command forge slurmctld's fields, under real Slurm (issue 32 §1).

``scontrol show job -o`` prints a job's ``JobState``, ``NodeList`` and ``OverSubscribe`` among fields its
user writes; imexctl reads slurmctld's answer with ``squeue`` over fields no user sets
(slurm/slurmctld.py). Each test submits a job whose ``--job-name``, ``--comment`` (with a newline and a
forged record), ``--output``/``--error``, working directory and script path hold ``JobState=``,
``OverSubscribe=`` and ``NodeList=`` text, and checks that it gets exactly the outcome an honest job gets:

- a job that may share its trays stays skipped (22.05 asks slurmctld: the forged ``OverSubscribe=NO``
  would have given it a domain, and the next job on the tray would have failed ``domain_busy``);
- an exclusive job whose text says it shares gets its domain;
- a het job whose text names other trays gets one domain over its components' trays;
- a tray whose domain does not come up by the deadline fails although the text says the job was
  cancelled (it would have exited 0, and the job would have run there without IMEX).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    JOB_TIMEOUT,
    UID,
    assert_domain_up,
    ctl_domain,
    diagnose,
    events,
    hold_script,
    imexctl_settings,
    job_dir,
    leftovers,
    release,
    wait_done,
    wait_started,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

TRAYS = NODES[:2]
NOTE = "imexctl: IMEX was not set up for job"


def forged(share: str) -> str:
    """What the job writes in every field it sets: slurmctld's fields with the values imexctl once read."""
    return f"x JobState=CANCELLED OverSubscribe={share} NodeList=node[1-4] Restarts=9 HetJobId=1 HetJobOffset=7"


def _hostile_dir(lab: SlurmLab, text: str) -> Path:
    d = lab.dir / "out" / text.replace("x ", "", 1)
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o1777)
    return d


def hostile_sbatch(lab: SlurmLab, share: str, headers: Sequence[str], *options: str) -> tuple[int, Path]:
    """Submit the hold script as a file in a forged directory, every user-set field forged; (job id, output)."""
    text = forged(share)
    where = _hostile_dir(lab, text)
    script = where / f"{text}.sh"
    out = where / "NodeList=node[1-4] JobState=CANCELLED %j.out"
    script.write_text("#!/bin/sh\n" + "".join(f"#SBATCH {h}\n" for h in headers) + hold_script(lab) + "\n")
    os.chmod(script, 0o755)
    argv = ["sbatch", "--parsable", "-J", text, "--comment", f"{text}\nJobId=1 {text}", "-o", str(out), "-e",
            str(out), "-D", str(where), *options, str(script)]  # fmt: skip
    res = lab.run(argv, user=UID, cwd=where, timeout=30)
    job = int(res.stdout.strip().split(";")[0].split("+")[0])
    return job, where / f"NodeList=node[1-4] JobState=CANCELLED {job}.out"


def test_a_shared_job_that_says_it_owns_its_trays_stays_skipped(lab: SlurmLab) -> None:
    """Partition ``shared``, no --exclusive, text saying OverSubscribe=NO: no domain, told, no drain."""
    job, output = hostile_sbatch(lab, "NO", [f"-N 2 -w {','.join(TRAYS)} -t 5 -p shared"])
    wait_started(lab, job)
    release(lab, job)
    wait_done(lab, job)
    for node in TRAYS:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1]["ok"] is True, f"{node}: {done}"
        assert "may share its trays" in done[-1].get("skipped", ""), f"{node}: {done[-1]}\n{diagnose(lab, job)}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert lab.node_states()[TRAYS[0]]["state"] == "idle", lab.node_states()
    assert NOTE in output.read_text(), output.read_text()


def test_an_exclusive_job_that_says_it_shares_gets_its_domain(lab: SlurmLab) -> None:
    """Partition ``debug`` (OverSubscribe=EXCLUSIVE), text saying OverSubscribe=OK: the job gets its domain."""
    job, output = hostile_sbatch(lab, "OK", [f"-N 2 -w {','.join(TRAYS)} -t 5 -p debug"])
    wait_started(lab, job)
    for node in TRAYS:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1]["ok"] is True and done[-1].get("trays") == 2, f"{node}: {done}"
        assert_domain_up(ctl_domain(lab, node, job), len(TRAYS), f"job {job} on {node}")
    release(lab, job)
    wait_done(lab, job)
    assert NOTE not in output.read_text()
    for node in TRAYS:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_a_het_job_that_names_other_trays_gets_its_own(lab: SlurmLab) -> None:
    """A het job (node1-2 + node3-4) whose text says NodeList=node[1-4] HetJobId=1: one domain, right nodes file."""
    headers = ["-N 2 -w node1,node2 -t 5 -p debug", "hetjob", "-N 2 -w node3,node4 -t 5 -p debug"]
    leader, _ = hostile_sbatch(lab, "NO", headers)
    wait_started(lab, leader)
    for node in NODES:
        het = events(lab, node, None, "imex.het_job")
        assert het and het[-1]["het_job_id"] == leader and het[-1]["components"] == 2, f"{node}: {het}"
        nodes = (job_dir(lab, node, leader) / "nodes_config.cfg").read_text().split()
        assert nodes == [lab.addr(n) for n in NODES], f"{node}: {nodes}"
        assert_domain_up(ctl_domain(lab, node, leader), len(NODES), f"het job {leader} on {node}")
    release(lab, leader)
    wait_done(lab, leader, timeout=JOB_TIMEOUT)
    wait_done(lab, leader + 1, timeout=JOB_TIMEOUT)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after het job {leader}"


SLOW = "node4"
DEADLINE_S = 6


def test_a_tray_that_times_out_still_fails_when_the_text_says_cancelled(lab: SlurmLab) -> None:
    """node4's command port refuses its peers: they time out and ask slurmctld, which says the job still
    configures (not the forged CANCELLED); the first to ask fails and is drained, none exits 0 for CANCELLED."""
    lab.faults.write_text(f"@{lab.addr(SLOW)} slow_start=2\n@{lab.addr(SLOW)} block_cmd\n")
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(DEADLINE_S)}}):
        job, _ = hostile_sbatch(lab, "NO", [f"-N 4 -w {','.join(NODES)} -t 5 -p debug"])
        done: dict[str, list[dict[str, object]]] = {}

        def all_done() -> bool:
            done.update({n: events(lab, n, job, "prolog.done") for n in NODES})
            return all(done.values())

        wait_for(all_done, DEADLINE_S + JOB_TIMEOUT, 0.2, what=f"every prolog of job {job} to end")
    failed = [n for n in NODES if done[n][-1].get("ok") is not True]
    for node in NODES:
        gone = events(lab, node, job, "prolog.job_ended")
        assert all(g["job_state"] != "CANCELLED" for g in gone), f"{node} believed the forged state: {gone}"
    assert failed and SLOW not in failed, f"job {job}: {done}\n{diagnose(lab, job)}"
    for node in failed:
        assert "not ready" in str(done[node][-1].get("reason")), f"{node}: {done[node]}"
    wait_for(lambda: all(lab.node_states()[n]["state"].startswith("drain") for n in failed), 30, what="the drains")
