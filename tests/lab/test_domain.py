"""A job's IMEX domain under real srun/sbatch: up on every node before the job runs, its own, gone after."""

from __future__ import annotations

import json

import pytest

from imexctl.channels.devices import channel_minor
from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    GID,
    JOB_TIMEOUT,
    SIM_CTL,
    UID,
    assert_domain_up,
    channel_dir,
    config_value,
    consume_steps,
    ctl_domain,
    events,
    hold_script,
    iso_time,
    job_dir,
    leftovers,
    read_steps,
    release,
    sbatch,
    sim_processes,
    srun_check,
    step_argv,
    wait_done,
    wait_started,
)
from tests.lab.procs import netns_pids
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm


def test_four_node_job_gets_domain_and_channel_and_leaves_nodes_clean(lab: SlurmLab) -> None:
    """A 4-node job of a normal user finds its domain UP and its channel on every node, and leaves nothing."""
    srun = lab.spawn(step_argv(lab, NODES, "--hold"), user=UID)
    try:
        checks = wait_for(lambda: read_steps(lab, NODES), JOB_TIMEOUT, what="the first step on every node")
        job = checks[NODES[0]]["job"]
        # while the job's first step runs: the domain is UP, seen from every tray
        for node in NODES:
            assert_domain_up(ctl_domain(lab, node, job), len(NODES), f"job {job} on {node}, during its first step")
    finally:
        consume_steps(lab, NODES)
        if "job" in locals():
            release(lab, job)
        out, err = srun.communicate(timeout=JOB_TIMEOUT)
    assert srun.returncode == 0, f"srun failed ({srun.returncode}):\n{out}\n{err}"
    minors = set()
    for node in NODES:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1].get("ok") is True, f"{node}: no successful prolog.done for job {job}: {done}"
        assert not done[-1].get("skipped"), f"{node}: the prolog skipped job {job}: {done[-1]}"
        ready = events(lab, node, job, "imex.ready")
        assert ready and ready[-1].get("status") == "domain UP", f"{node}: {ready}"
        rec = checks[node]
        assert iso_time(ready[-1]["timestamp"]) < rec["t"], f"{node}: the step started before the domain was UP"
        assert rec["host"] == node and rec["uid"] == UID
        assert len(rec["channels"]) == 1, f"{node}: channels visible to the step: {rec['channels']}"
        ch = rec["channels"][0]
        assert ch["chr"] and (ch["uid"], ch["gid"], ch["mode"]) == (UID, GID, 0o600), f"{node}: {ch}"
        assert ch["name"] == f"channel{ch['minor']}" and ch["major"] == 234, f"{node}: {ch}"
        minors.add(ch["minor"])
    assert len(minors) == 1, f"channel minors differ between nodes: {checks}"
    # no topology source: position 0 of slurm.conf's four nodes (design.md "The channel rule")
    assert minors == {channel_minor(job, 2048, 0, len(NODES))}, minors
    wait_done(lab, job)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_job_step_can_query_its_domain_with_nvidia_imex_ctl(lab: SlurmLab) -> None:
    """The job's first step, run by the job's user, sees its domain UP through nvidia-imex-ctl -N -j."""
    job, checks = srun_check(lab, NODES[:2], "--ctl", str(SIM_CTL))
    for node, rec in checks.items():
        ctl = rec["ctl"]
        assert ctl["rc"] == 0 and "Permission denied" not in ctl["stderr"], f"{node}: {ctl['stderr'].strip()}"
        assert_domain_up(json.loads(ctl["stdout"]), 2, f"{node} (as uid {rec['uid']}, from the job's first step)")
    wait_done(lab, job)


def test_two_jobs_side_by_side_have_independent_domains(lab: SlurmLab) -> None:
    """Two 2-node jobs get their own domains and ports, and ending one leaves the other UP."""
    a = sbatch(lab, hold_script(lab), NODES[:2])
    b = sbatch(lab, hold_script(lab), NODES[2:])
    wait_started(lab, a)
    wait_started(lab, b)
    ports = {}
    for job, nodes in ((a, NODES[:2]), (b, NODES[2:])):
        for node in nodes:
            assert_domain_up(ctl_domain(lab, node, job), 2, f"job {job} on {node}")
        ports[job] = {config_value(job_dir(lab, n, job) / "config.cfg", "SERVER_PORT") for n in nodes}
        assert len(ports[job]) == 1, f"job {job} has different SERVER_PORTs on its nodes: {ports[job]}"
    assert ports[a] != ports[b], f"both jobs use SERVER_PORT {ports[a]}"
    b_daemons = {node: sim_processes(lab, node, b) for node in NODES[2:]}
    b_channels = {node: sorted(p.name for p in channel_dir(lab, node).glob("channel*")) for node in NODES[2:]}

    release(lab, a)
    wait_done(lab, a)
    for node in NODES[:2]:
        assert leftovers(lab, node) == [], f"{node} not clean after job {a}"
    for node in NODES[2:]:
        assert sim_processes(lab, node, b) == b_daemons[node], f"{node}: job {b}'s daemon changed"
        assert sorted(p.name for p in channel_dir(lab, node).glob("channel*")) == b_channels[node]
        assert_domain_up(ctl_domain(lab, node, b), 2, f"job {b} on {node} after job {a} ended")
    assert lab.job(b)["JobState"] == "RUNNING"

    release(lab, b)
    wait_done(lab, b)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {b}"


def test_twenty_jobs_back_to_back_leak_nothing(lab: SlurmLab) -> None:
    """Twenty jobs in a row on the same nodes all get their channel, and nothing accumulates."""
    nodes = NODES[2:]
    before = {n: netns_pids(lab.netns(n)) for n in nodes}
    jobs = []
    for _ in range(20):
        job, checks = srun_check(lab, nodes)
        jobs.append(job)
        for node, rec in checks.items():
            assert [(c["uid"], c["gid"]) for c in rec["channels"]] == [(UID, GID)], (
                f"job {job} on {node}: {rec['channels']}"
            )
    for job in jobs:
        wait_done(lab, job)
    for node in nodes:
        assert leftovers(lab, node) == [], f"{node} leaks after 20 jobs"
        wait_for(
            lambda: len(netns_pids(lab.netns(node))) <= len(before[node]),
            15,
            what=f"{node}: only slurmd left in the namespace",
        )
        assert netns_pids(lab.netns(node)) == before[node]
