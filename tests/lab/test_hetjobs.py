"""Heterogeneous jobs under real Slurm: one IMEX domain over all components' trays (issue 9).

slurmd gives each component's prolog ``SLURM_HET_JOB_ID`` (the leader's id) but only its own
component's nodes; imexctl asks slurmctld once for the others (``[slurm] het_jobs = joint``) and keys
the domain by the leader's id. With ``het_jobs = per_component`` each component is a domain of its own.
"""

from __future__ import annotations

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    JOB_TIMEOUT,
    UID,
    assert_domain_up,
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

pytestmark = pytest.mark.slurm

FIRST, SECOND = NODES[:2], NODES[2:]


def _het_sbatch(lab: SlurmLab) -> int:
    """Submit a two-component het job (node1-2, node3-4) running the hold script; return the leader id."""
    script = lab.dir / "out" / "hetjob.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"#SBATCH -N 2 -w {','.join(FIRST)} -t 5 -o {lab.dir}/out/%j.out\n"
        "#SBATCH hetjob\n"
        f"#SBATCH -N 2 -w {','.join(SECOND)} -t 5\n"
        f"{hold_script(lab)}\n"
    )
    script.chmod(0o644)
    res = lab.run(["sbatch", "--parsable", str(script)], user=UID)
    return int(res.stdout.strip().split(";")[0].split("+")[0])


def test_het_job_components_share_one_domain(lab: SlurmLab) -> None:
    """Both components' prologs set up one domain keyed by the leader: one port, one minor, one nodes file."""
    leader = _het_sbatch(lab)
    wait_started(lab, leader)
    ports, minors, nodes_files = set(), set(), set()
    for node in NODES:
        comp = leader if node in FIRST else leader + 1
        het = events(lab, node, comp, "imex.het_job")
        assert het and het[-1]["mode"] == "joint" and het[-1]["het_job_id"] == leader, f"{node}: {het}"
        assert het[-1]["components"] == 2 and het[-1]["trays"] == len(NODES), f"{node}: {het}"
        assert not job_dir(lab, node, leader + 1).exists(), f"{node}: a domain keyed by the component id"
        assert_domain_up(ctl_domain(lab, node, leader), len(NODES), f"het job {leader} on {node}")
        ports.add(config_value(job_dir(lab, node, leader) / "config.cfg", "SERVER_PORT"))
        nodes_files.add((job_dir(lab, node, leader) / "nodes_config.cfg").read_text())
        created = [r for r in events(lab, node, None, "device.channel.created") if r["job_id"] in (leader, comp)]
        assert len(created) == 1, f"{node}: channels made for het job {leader}: {created}"
        minors.add(created[0]["minor"])
    assert len(ports) == 1 and len(minors) == 1 and len(nodes_files) == 1, (ports, minors, nodes_files)
    assert nodes_files.pop().split() == [lab.addr(n) for n in NODES]
    release(lab, leader)
    wait_done(lab, leader, timeout=JOB_TIMEOUT)
    wait_done(lab, leader + 1, timeout=JOB_TIMEOUT)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after het job {leader}"
        comp = leader if node in FIRST else leader + 1
        assert events(lab, node, comp, "epilog.done")[-1]["ok"], f"{node}: {events(lab, node, comp)}"
