"""Channel numbers under the real slurmd: no two jobs alive at once in one NVLink clique hold one (issue 41).

design.md "The channel rule". ``[policy] channel_count = 5`` keeps the turns of the job id few, so that the
cases where numbers could meet come with every job instead of one in 113:

- an ending job's trays come back to service one by one: the next job starts on the old job's first tray
  while the old job's epilog, daemon and channel still live on its second tray (the simulator's
  ``stop_delay`` makes that epilog's stop take seconds). Both domains start at the same tray of slurm.conf's
  four (the clique without a topology source): one number (T = 1). The new job's first tray waits until
  slurmctld no longer lists the old job on that tray, and only then starts its daemon and makes its channel;
- topology blocks without an ``imexctl-key`` split one clique: two jobs at once, one per block, with job ids
  of one parity, got one number when each block counted as its own clique (T = 2); the whole file is one
  clique now. imexctl reads the file itself, so this runs on 22.05 too (no ``TopologyPlugin`` needed).

Each job's step, as the job's user, sees exactly its one channel on each of its trays.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    JOB_TIMEOUT,
    UID,
    consume_steps,
    diagnose,
    events,
    hold_script,
    imexctl_settings,
    iso_time,
    leftovers,
    release,
    sbatch,
    wait_done,
    wait_started,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

#: four trays in slurm.conf and 5 channels: T = 1, the number is 1 + the domain's first position
POLICY = {"policy": {"channel_count": "5"}, "readiness": {"deadline_s": "20"}}
#: how long the old job's daemon on its second tray takes to stop after SIGTERM
STOP_DELAY_S = 8


def _steps(lab: SlurmLab, job: int, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """Run the step checker as a step of ``job`` (as its user) on ``nodes``; each node's result."""
    for node in nodes:
        (lab.dir / "out" / f"step-{job}-{node}.json").unlink(missing_ok=True)
    argv = ["srun", f"--jobid={job}", "--overlap", "-N", str(len(nodes)), "-w", ",".join(nodes), "-t", "2",
            "/usr/bin/python3", "-I", str(lab.dir / "bin" / "stepcheck.py"), str(lab.dir)]  # fmt: skip
    res = lab.run(argv, user=UID, timeout=JOB_TIMEOUT, check=False)
    assert res.returncode == 0, f"step of job {job} failed:\n{res.stdout}\n{res.stderr}\n{diagnose(lab, job)}"
    found = consume_steps(lab, nodes)  # removed, so that no later test reads them as its own
    assert found and all(r["job"] == job for r in found.values()), found
    return found


def _one_channel(steps: dict[str, dict[str, Any]], job: int) -> int:
    """The one channel every tray's step of ``job`` sees, owned by the job's user; its number."""
    seen = {node: [(c["name"], c["uid"], c["minor"]) for c in r["channels"]] for node, r in steps.items()}
    numbers = {chans[0][2] for chans in seen.values() if len(chans) == 1 and chans[0][1] == UID}
    assert len(numbers) == 1 and all(len(c) == 1 for c in seen.values()), f"job {job}'s steps see {seen}"
    return numbers.pop()


def _at(record: dict[str, Any]) -> float:
    return iso_time(record["timestamp"])


def test_a_job_on_an_ending_jobs_first_tray_waits_until_the_old_domain_is_gone(lab: SlurmLab) -> None:
    """Job A on node1,node2 ends; node1's epilog ends at once, node2's takes about 8 s. Job B on node1,node3
    starts meanwhile with A's number: B's daemon and channel come only after node2's epilog ended."""
    a_nodes, b_nodes = NODES[:2], [NODES[0], NODES[2]]
    lab.faults.write_text(f"@{lab.addr(NODES[1])} stop_delay={STOP_DELAY_S}\n")
    with imexctl_settings(lab, POLICY):
        job_a = sbatch(lab, hold_script(lab), a_nodes)
        wait_started(lab, job_a)
        number_a = _one_channel(_steps(lab, job_a, a_nodes), job_a)
        job_b = sbatch(lab, hold_script(lab), b_nodes)  # pends until node1 comes back
        release(lab, job_a)
        try:
            wait_started(lab, job_b, timeout=JOB_TIMEOUT)
            number_b = _one_channel(_steps(lab, job_b, b_nodes), job_b)
        finally:
            release(lab, job_b)
        wait_done(lab, job_a)
        wait_done(lab, job_b)
    (a_gone,) = events(lab, NODES[1], job_a, "epilog.done")
    b_began = min(_at(e) for e in events(lab, NODES[0], job_b))
    assert b_began < _at(a_gone), (
        f"job {job_b} began on {NODES[0]} only after job {job_a}'s epilog on {NODES[1]} had ended: "
        f"no overlap to test\n{diagnose(lab, job_b)}"
    )
    assert number_a == number_b == 1, (number_a, number_b)  # both domains start at position 0: one number
    for node in b_nodes:
        (created,) = events(lab, node, job_b, "device.channel.created")
        assert _at(created) >= _at(a_gone), (
            f"{node}: job {job_b} made channel {number_b} at {created['timestamp']} while job {job_a}'s domain, "
            f"channel {number_a}, still lived on {NODES[1]} (its epilog ended at {a_gone['timestamp']})"
        )
    (waited,) = events(lab, NODES[0], job_b, "imex.channel.waited")
    assert (waited["old_job_id"], waited["trays"], waited["channel"]) == (job_a, NODES[1], 1), waited
    assert "slurmctld says" in waited["how"] and waited["waited_s"] > 0, waited
    for node in NODES:
        assert leftovers(lab, node) == [], node


@pytest.fixture
def keyless_blocks(lab: SlurmLab) -> Iterator[None]:
    """topology.conf of two blocks without keys (node1-2, node3-4) in each node's root, read by imexctl."""
    text = f"BlockName=b1 Nodes={NODES[0]},{NODES[1]}\nBlockName=b2 Nodes={NODES[2]},{NODES[3]}\n"
    paths = []
    for node in NODES:
        path = lab.node_root(node) / "etc/slurm/topology.conf"
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
        paths.append(path)
    settings = {"topology": {"source": "topology_conf"}, "paths": {"topology_file": "/etc/slurm/topology.conf"}}
    try:
        with imexctl_settings(lab, {**POLICY, **settings}):
            yield
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def _held(lab: SlurmLab, nodes: list[str], parity: int) -> int:
    """A held hold_script job on ``nodes`` whose id has ``parity`` (ids of the other parity are cancelled unrun)."""
    while True:
        job = sbatch(lab, hold_script(lab), nodes, extra=["--hold"])
        if job % 2 == parity:
            return job
        lab.run(["scancel", str(job)])


def test_two_jobs_in_keyless_blocks_of_one_clique_hold_different_numbers(lab: SlurmLab, keyless_blocks: None) -> None:
    """One job per keyless block at once, ids of one parity: each step sees its one channel, and they differ."""
    first = sbatch(lab, hold_script(lab), NODES[:2], extra=["--hold"])
    second = _held(lab, NODES[2:], first % 2)
    jobs = {first: NODES[:2], second: NODES[2:]}
    try:
        lab.run(["scontrol", "release", str(first), str(second)])
        for job in jobs:
            wait_started(lab, job)
        wait_for(lambda: all(lab.job(j).get("JobState") == "RUNNING" for j in jobs), 30, what="both jobs running")
        numbers = {job: _one_channel(_steps(lab, job, nodes), job) for job, nodes in jobs.items()}
    finally:
        for job in jobs:
            release(lab, job)
    for job in jobs:
        wait_done(lab, job)
    assert numbers == {first: 1, second: 3}, f"two domains alive at once in one clique: {numbers}"
    for job, nodes in jobs.items():
        for node in nodes:
            (created,) = events(lab, node, job, "device.channel.created")
            assert created["clique"].startswith("every block of ") and created["clique_trays"] == 4, created
    for node in NODES:
        assert leftovers(lab, node) == [], node
