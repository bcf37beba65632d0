"""A job on one tray under real Slurm, by ``[policy] single_tray`` (issue 9; configuration.md says why).

The default, ``domain``, gives a one-tray job a one-tray IMEX domain and its channel: CUDA's fabric
memory handles need a running daemon and a channel even on one node.
"""

from __future__ import annotations

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    GID,
    UID,
    assert_domain_up,
    consume_steps,
    ctl_domain,
    events,
    imexctl_settings,
    leftovers,
    read_steps,
    release,
    sim_processes,
    srun_check,
    step_argv,
    wait_done,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

NODE = NODES[0]


def test_default_single_tray_job_gets_a_one_tray_domain_and_its_channel(lab: SlurmLab) -> None:
    """By default a one-tray job finds a one-tray domain UP, its daemon running and its channel."""
    srun = lab.spawn(step_argv(lab, [NODE], "--hold"), user=UID)
    try:
        checks = wait_for(lambda: read_steps(lab, [NODE]), 60, what="the step")
        job = checks[NODE]["job"]
        assert_domain_up(ctl_domain(lab, NODE, job), 1, f"one-tray job {job}")
        assert len(sim_processes(lab, NODE, job)) == 1, f"daemons of job {job}: {sim_processes(lab, NODE, job)}"
    finally:
        consume_steps(lab, [NODE])
        if "job" in locals():
            release(lab, job)
        out, err = srun.communicate(timeout=60)
    assert srun.returncode == 0, f"srun failed ({srun.returncode}):\n{out}\n{err}"
    done = events(lab, NODE, job, "prolog.done")[-1]
    assert done["ok"] and done["trays"] == 1 and done["ready"] and done["channel"], done
    chans = checks[NODE]["channels"]
    assert len(chans) == 1 and (chans[0]["uid"], chans[0]["gid"], chans[0]["mode"]) == (UID, GID, 0o600), chans
    assert f"channel{chans[0]['minor']}" == done["channel"].rsplit("/", 1)[1], (chans, done)
    wait_done(lab, job)
    assert leftovers(lab, NODE) == []


@pytest.mark.parametrize("policy", ["channel", "none"])
def test_single_tray_policies_channel_and_none(lab: SlurmLab, policy: str) -> None:
    """``channel``: the job's channel and no daemon; ``none``: nothing, and the job still runs."""
    with imexctl_settings(lab, {"policy": {"single_tray": policy}}):
        job, checks = srun_check(lab, [NODE])
    chans = checks[NODE]["channels"]
    done = events(lab, NODE, job, "prolog.done")[-1]
    assert done["ok"], done
    if policy == "channel":
        assert done.get("daemon") is False and done["trays"] == 1, done
        assert len(chans) == 1 and (chans[0]["uid"], chans[0]["gid"]) == (UID, GID), chans
        assert f"channel{chans[0]['minor']}" == done["channel"].rsplit("/", 1)[1], (chans, done)
        assert not events(lab, NODE, job, "imex.daemon.started"), "single_tray = channel started a daemon"
    else:
        assert "single_tray = none" in done.get("skipped", ""), done
        assert chans == [], chans
    wait_done(lab, job)
    assert leftovers(lab, NODE) == []
