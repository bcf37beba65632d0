"""``[resolve] method = slurm_conf`` under the real slurmd: each tray's address from slurm.conf's ``NodeAddr`` (issue 22).

The lab's slurm.conf names every node with ``NodeAddr=`` (its namespace's address) and the prolog gets that
slurm.conf as ``SLURM_CONF`` from slurmd. With ``method = slurm_conf`` the nodes file lists those addresses,
read from the file slurmd uses rather than from DNS or a hosts file, and the domain comes up.
"""

from __future__ import annotations

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    assert_domain_up,
    ctl_domain,
    events,
    hold_script,
    imexctl_settings,
    job_dir,
    leftovers,
    release,
    sbatch,
    wait_done,
    wait_started,
)

pytestmark = pytest.mark.slurm

TRAYS = NODES[:2]


def test_addresses_come_from_node_addr_in_slurm_conf(lab: SlurmLab) -> None:
    """The nodes file holds each tray's NodeAddr from slurm.conf, and the domain is UP on both trays."""
    assert all(f"NodeName={n} NodeAddr={lab.addr(n)} " in lab.conf.read_text() for n in TRAYS)
    with imexctl_settings(lab, {"resolve": {"method": "slurm_conf"}}):
        job = sbatch(lab, hold_script(lab), TRAYS)
        try:
            wait_started(lab, job)
            want = [lab.addr(n) for n in TRAYS]
            for node in TRAYS:
                assert (job_dir(lab, node, job) / "nodes_config.cfg").read_text().split() == want, node
                assert_domain_up(ctl_domain(lab, node, job), len(TRAYS), f"job {job} on {node}")
                resolved = events(lab, node, job, "imex.nodes.resolved")[-1]
                assert resolved["addresses"] == want, resolved
        finally:
            release(lab, job)
        wait_done(lab, job)
    for node in TRAYS:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
