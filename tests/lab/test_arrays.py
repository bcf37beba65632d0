"""Job arrays under real Slurm: each array task is a job of its own, with its own IMEX domain (issue 9)."""

from __future__ import annotations

import pytest

from imexctl.channels.devices import channel_minor
from imexctl.slurm import nodelist
from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    UID,
    USER,
    assert_domain_up,
    channel_dir,
    config_value,
    ctl_domain,
    events,
    hold_script,
    job_dir,
    leftovers,
    release,
    wait_done,
    wait_started,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm


def _array_tasks(lab: SlurmLab, array: int, n: int) -> dict[int, list[str]]:
    """Return {job id: nodes} of the array's running tasks once all ``n`` run (None before)."""
    res = lab.run(["squeue", "-h", "-r", "-u", USER, "-t", "R", "-o", "%A %F %N"], check=False)
    tasks = {}
    for line in res.stdout.splitlines():
        job, parent, nodes = line.split()
        if int(parent) == array:
            tasks[int(job)] = nodelist.expand(nodes)
    return tasks if len(tasks) == n else {}


def test_array_tasks_in_flight_get_their_own_domains(lab: SlurmLab) -> None:
    """Two 2-tray array tasks running side by side: two domains, ports and channels, each torn down alone. Without
    a topology source the channel is placed among slurm.conf's nodes (design.md "The channel rule"): each task's
    number is 1 + position + 4 * (job % 511), its first tray's position in the lab's four nodes."""
    res = lab.run(
        [
            "sbatch",
            "--parsable",
            "--array=0-1",
            "-N",
            "2",
            "-t",
            "5",
            "-o",
            f"{lab.dir}/out/%A_%a.out",
            "--wrap",
            hold_script(lab),
        ],
        user=UID,
    )
    array = int(res.stdout.strip().split(";")[0])
    tasks = wait_for(lambda: _array_tasks(lab, array, 2), 60, 0.2, what=f"both tasks of array {array} running")
    assert sorted(n for nodes in tasks.values() for n in nodes) == NODES, f"tasks share trays: {tasks}"
    ports, minors = {}, {}
    for job, nodes in tasks.items():
        wait_started(lab, job)
        for node in nodes:
            assert_domain_up(ctl_domain(lab, node, job), 2, f"array task {job} on {node}")
            assert [int(p.name[7:]) for p in channel_dir(lab, node).glob("channel*")] == [
                events(lab, node, job, "device.channel.created")[-1]["minor"]
            ], f"{node}: channels {sorted(channel_dir(lab, node).iterdir())}"
        ports[job] = {config_value(job_dir(lab, n, job) / "config.cfg", "SERVER_PORT") for n in nodes}
        minors[job] = {events(lab, n, job, "device.channel.created")[-1]["minor"] for n in nodes}
        assert len(ports[job]) == 1 and len(minors[job]) == 1, f"task {job}: ports {ports[job]}, minors {minors[job]}"
        assert minors[job] == {channel_minor(job, 2048, min(NODES.index(n) for n in nodes), len(NODES))}, minors
        created = {
            (e["clique"], e["clique_trays"]) for n in nodes for e in events(lab, n, job, "device.channel.created")
        }
        assert created == {("slurm.conf", len(NODES))}, created
    first, second = sorted(tasks)
    assert ports[first] != ports[second] and minors[first] != minors[second], f"ports {ports}, minors {minors}"

    release(lab, first)
    wait_done(lab, first)
    for node in tasks[first]:
        assert leftovers(lab, node) == [], f"{node} not clean after array task {first}"
    for node in tasks[second]:
        assert_domain_up(ctl_domain(lab, node, second), 2, f"array task {second} on {node} after {first} ended")
    release(lab, second)
    wait_done(lab, second)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after array {array}"
