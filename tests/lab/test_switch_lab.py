"""``SwitchType=switch/nvidia_imex`` with imexctl: Slurm's plugin owns the channels, imexctl makes none (issue 9).

The module restarts the lab with ``SwitchType=switch/nvidia_imex`` (Slurm 24.05 and later; Debian 13's
slurm-wlm ships ``switch_nvidia_imex.so``) and ``SlurmctldDebug=debug``, under which 24.11's slurmctld
logs the channel it allocates to each job. slurmd runs every job, but the plugin makes no device node
here: it takes the channel major from the real ``/proc/devices`` (or ``SwitchParameters=imex_dev_major=``),
this host has no NVIDIA driver, so each slurmd logs "nvidia-caps-imex-channels major device not found,
plugin disabled" and the steps get no channel from Slurm (SchedMD/slurm
``src/plugins/switch/nvidia_imex/imex_device.c``). ``imex_dev_major`` stays unset on purpose: the plugin
would then empty ``/dev/nvidia-caps-imex-channels`` in the host's ``/dev`` (the Debian root binds it) and
mknod there. So what is tested is imexctl's side, with the slurm.conf slurmd hands the prolog
(``SLURM_CONF``): detected (``[policy] channels = job``; the prolog logs ``imex.channels.slurm``) or
configured (``channels = none``), imexctl creates no channel, still brings the domain UP with its nodes
file and port, and the epilog tears it down. 22.05 has no such plugin: skipped there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
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

JOB_NODES = NODES[:2]
DISABLED = "nvidia-caps-imex-channels major device not found, plugin disabled"


@pytest.fixture(scope="module", autouse=True)
def switch_plugin(lab: SlurmLab) -> Iterator[None]:
    """The lab with SwitchType=switch/nvidia_imex for this module, then as before."""
    if lab.version_info < (24, 5):
        pytest.skip(f"switch/nvidia_imex needs Slurm 24.05 or later, the lab runs {lab.version}")
    before = lab.extra_conf, dict(lab.extra_etc)
    marks = {n: lab.slurmd_log(n).stat().st_size for n in NODES}
    # 26.05 logs the channel allocation under DebugFlags=Switch only (log_flag in switch_nvidia_imex.c)
    lab.restart(before[0] + "SwitchType=switch/nvidia_imex\nSlurmctldDebug=debug\nDebugFlags=Switch\n", before[1])
    try:
        for node in NODES:
            assert DISABLED in _log_since(lab.slurmd_log(node), marks[node]), f"{node}: slurmd did not load the plugin"
        yield
    finally:
        lab.restart(*before)


def _log_since(path: Path, offset: int) -> str:
    with open(path, errors="replace") as fh:
        fh.seek(offset)
        return fh.read()


@pytest.mark.parametrize("how", ["detected", "configured", "per-segment"])
def test_imexctl_makes_no_channel_and_still_runs_the_domain(lab: SlurmLab, how: str) -> None:
    """Slurm allocates the job a channel; imexctl makes none, brings the domain UP, and the epilog removes it.

    ``per-segment``: Slurm 25.11's ``--network=unique-channel-per-segment`` (one channel per segment under
    topology/block, one per job without it; switch_nvidia_imex.c): the same for imexctl.
    """
    if how == "per-segment" and lab.version_info < (25, 11):
        pytest.skip(f"--network=unique-channel-per-segment came in Slurm 25.11, the lab runs {lab.version}")
    ctld_mark = lab.slurmctld_log.stat().st_size
    changes = {"policy": {"channels": "none"}} if how == "configured" else {}
    extra = ["--network=unique-channel-per-segment"] if how == "per-segment" else []
    with imexctl_settings(lab, changes):
        job = sbatch(lab, hold_script(lab), JOB_NODES, extra=extra)
        try:
            wait_started(lab, job)
            want = [lab.addr(n) for n in JOB_NODES]
            ports = set()
            for node in JOB_NODES:
                jd = job_dir(lab, node, job)
                assert (jd / "nodes_config.cfg").read_text().split() == want, f"{node}: nodes file of job {job}"
                assert_domain_up(ctl_domain(lab, node, job), len(JOB_NODES), f"job {job} on {node}")
                ports.add(config_value(jd / "config.cfg", "SERVER_PORT"))
                assert sorted(channel_dir(lab, node).glob("channel*")) == [], f"{node}: imexctl made a channel"
                done = events(lab, node, job, "prolog.done")[-1]
                assert done["ok"] and done["channel"] == "" and done["trays"] == len(JOB_NODES), done
                said = events(lab, node, job, "imex.channels.slurm")
                assert bool(said) == (how != "configured"), f"{node} ({how}): imex.channels.slurm {said}"
            assert len(ports) == 1, f"SERVER_PORTs of job {job}: {ports}"
        finally:
            release(lab, job)
        wait_done(lab, job)
    # 24.11 logs the allocation at debug level (switch_p_job_start), 26.05 under DebugFlags=Switch
    # ("allocating channel N to JobId=J with node_list ...", _allocate_channel)
    ctld = _log_since(lab.slurmctld_log, ctld_mark)
    assert re.search(rf"allocating channel \d+ to JobId={job}\b", ctld), f"slurmctld allocated job {job} no channel"
    for node in JOB_NODES:
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, node
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
