"""topology/block in topology.conf: the blocks slurmctld schedules by are the blocks imexctl splits by (issue 9).

The module restarts the lab with ``TopologyPlugin=topology/block`` and a topology.conf of two blocks of
two nodes beside slurm.conf (``BlockSizes=2,4``: the base block is two nodes, and a four-node job may
take both; topology.conf(5) of 24.11). imexctl reads the very same file (``[topology] source =
topology_conf``): each node root's ``/etc/slurm/topology.conf`` is a hard link to the lab's, as a site
installs one file on slurmctld and every node. Slurm 22.05 has no topology/block (it came in 23.11):
skipped there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    UID,
    assert_domain_up,
    channel_dir,
    config_value,
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

BLOCKS = {"nvl-a": NODES[:2], "nvl-b": NODES[2:]}
TOPOLOGY = "".join(f"BlockName={b} Nodes={','.join(ns)}\n" for b, ns in BLOCKS.items()) + "BlockSizes=2,4\n"
NODE_COPY = "/etc/slurm/topology.conf"


@pytest.fixture(scope="module", autouse=True)
def blocks(lab: SlurmLab) -> Iterator[None]:
    """The lab with topology/block and the two blocks for this module, imexctl reading the same file."""
    if lab.version_info < (23, 11):
        pytest.skip(f"topology/block needs Slurm 23.11 or later, the lab runs {lab.version}")
    before = lab.extra_conf, dict(lab.extra_etc)
    links: list[Path] = []
    lab.restart(before[0] + "TopologyPlugin=topology/block\n", {**before[1], "topology.conf": TOPOLOGY})
    try:
        for node in NODES:
            link = lab.node_root(node) / NODE_COPY.lstrip("/")
            link.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.link(lab.dir / "etc" / "topology.conf", link)
            links.append(link)
        settings = {"topology": {"source": "topology_conf"}, "paths": {"topology_file": NODE_COPY}}
        with imexctl_settings(lab, settings):
            yield
    finally:
        for link in links:
            link.unlink(missing_ok=True)
        lab.restart(*before)


def _channels(lab: SlurmLab, node: str) -> list[str]:
    return sorted(p.name for p in channel_dir(lab, node).glob("channel*"))


def _job_nodes(lab: SlurmLab, job: int) -> list[str]:
    nodelist = lab.job(job)["NodeList"]
    return lab.run(["scontrol", "show", "hostnames", nodelist], timeout=30).stdout.split()


def test_slurmctld_schedules_by_the_blocks_of_topology_conf(lab: SlurmLab) -> None:
    """scontrol show topology lists the two blocks, and a 2-node job without -w lands in one block: one domain."""
    shown = lab.run(["scontrol", "show", "topology"], timeout=30).stdout
    for block, members in BLOCKS.items():
        line = next((ln for ln in shown.splitlines() if f"BlockName={block} " in ln), "")
        assert line, f"slurmctld shows no block {block}:\n{shown}"
        listed = lab.run(["scontrol", "show", "hostnames", line.split("Nodes=")[1].split()[0]], timeout=30)
        assert listed.stdout.split() == members, f"block {block}: {line}"
    res = lab.run(
        ["sbatch", "--parsable", "-N", "2", "-t", "5", "-o", f"{lab.dir}/out/%j.out", "--wrap", hold_script(lab)],
        user=UID,
        timeout=30,
    )
    job = int(res.stdout.strip().split(";")[0])
    try:
        wait_started(lab, job)
        nodes = _job_nodes(lab, job)
        assert nodes in BLOCKS.values(), f"Slurm placed job {job} on {nodes}, not inside one block"
        want = [lab.addr(n) for n in nodes]
        for node in nodes:
            assert (job_dir(lab, node, job) / "nodes_config.cfg").read_text().split() == want, node
            assert_domain_up(ctl_domain(lab, node, job), 2, f"job {job} on {node}")
            assert not events(lab, node, job, "imex.domain.split"), f"{node}: a one-block job was split"
    finally:
        release(lab, job)
    wait_done(lab, job)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_job_over_both_blocks_gets_one_domain_per_block(lab: SlurmLab) -> None:
    """A 4-node job: two 2-tray domains, each tray's nodes file its block's trays; one port and channel minor."""
    job = sbatch(lab, hold_script(lab), NODES)
    try:
        wait_started(lab, job)
        ports, channels = set(), set()
        for block, members in BLOCKS.items():
            want = [lab.addr(n) for n in members]
            for node in members:
                jd = job_dir(lab, node, job)
                assert (jd / "nodes_config.cfg").read_text().split() == want, f"{node}: nodes file of job {job}"
                assert_domain_up(ctl_domain(lab, node, job), 2, f"job {job} on {node} (block {block})")
                split = events(lab, node, job, "imex.domain.split")
                assert split and split[-1]["domain"] == block, f"{node}: {split}"
                assert (split[-1]["trays"], split[-1]["domains"], split[-1]["outside"]) == (2, 2, ""), split[-1]
                ports.add(config_value(jd / "config.cfg", "SERVER_PORT"))
                channels.add(tuple(_channels(lab, node)))
        assert len(ports) == 1, f"SERVER_PORTs of job {job} differ between its domains: {ports}"
        assert len(channels) == 1 and len(next(iter(channels))) == 1, f"channels of job {job}: {channels}"
    finally:
        release(lab, job)
    wait_done(lab, job)
    for node in NODES:
        assert events(lab, node, job, "prolog.done")[-1]["trays"] == 2, node
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
