"""The hooks as slurmd really runs them: its bare environment (by Slurm version) and a detached daemon."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    JOB_TIMEOUT,
    PROLOG_TIMEOUT,
    UID,
    SlurmdLogs,
    hold_script,
    leftovers,
    prolog_processes,
    release,
    sbatch,
    sim_processes,
    wait_done,
    wait_started,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm


def test_hooks_run_in_slurmds_environment_and_detach_the_daemon(lab: SlurmLab) -> None:
    """The prolog works with slurmd's bare environment, returns promptly, and its daemon is fully detached."""
    nodes = NODES[:2]
    lab.faults.write_text("slow_start=2\n")  # keeps the prolog running long enough to read its environment
    logs = SlurmdLogs(lab, nodes)
    job = sbatch(lab, hold_script(lab), nodes)
    seen: dict[str, dict[str, Any]] = {}

    def caught() -> bool:
        for rec in prolog_processes(job):
            seen.setdefault(rec["env"].get("SLURMD_NODENAME", "?"), rec)
        return len(seen) == len(nodes) or (lab.dir / "out" / f"started-{job}").exists()

    wait_for(caught, JOB_TIMEOUT, 0.01, what=f"the prologs of job {job}")
    info = wait_started(lab, job)
    times = logs.prolog_times()
    lab.faults.write_text("")
    assert sorted(seen) == nodes, f"could not catch the running prologs: {seen}"
    env = seen[nodes[0]]["env"]
    assert "PATH" not in env, f"slurmd gave the prolog a PATH: {env.get('PATH')}"
    assert env.get("SLURM_NODELIST") == "node[1-2]", env
    if lab.version_info >= (23, 2):
        # 23.02 added both to the prolog's environment (Slurm's CHANGELOG/slurm-23.02.md)
        assert env.get("SLURM_JOB_NODELIST") == "node[1-2]", env
        assert env.get("SLURM_JOB_OVERSUBSCRIBE") == "NO", f"OverSubscribe=EXCLUSIVE partition: {env}"
    else:
        assert "SLURM_JOB_NODELIST" not in env and "SLURM_JOB_OVERSUBSCRIBE" not in env, env
    assert env.get("SLURM_JOB_UID") == str(UID) and env.get("SLURM_SCRIPT_CONTEXT") == "prolog_slurmd", env
    for node in nodes:
        prolog = seen[node]
        slurmd = lab.slurmd_pid(node)
        assert prolog["pgid"] == prolog["pid"] != os.getpgid(slurmd), f"{node}: prolog {prolog} slurmd {slurmd}"
        daemons = sim_processes(lab, node, job)
        assert len(daemons) == 1, f"{node}: daemons of job {job}: {daemons}"
        pid = daemons[0][0]
        assert os.getsid(pid) not in (os.getsid(slurmd), prolog["sid"]), f"{node}: daemon {pid} in slurmd's session"
        assert os.getpgid(pid) not in (os.getpgid(slurmd), prolog["pgid"]), f"{node}: daemon {pid} in a hook's group"
        fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        pipes = {fd: t for fd, t in fds.items() if t.startswith("pipe:")}
        assert not pipes, f"{node}: daemon {pid} holds pipes (slurmd's?): {pipes}"
        # compared by device, not by name: /proc shows a chrooted daemon's /dev/null under the root's path
        stdin = os.stat(f"/proc/{pid}/fd/0")
        assert stat.S_ISCHR(stdin.st_mode) and stdin.st_rdev == os.stat("/dev/null").st_rdev, (
            f"{node}: daemon stdin is {fds.get('0')}"
        )
    assert sorted(times) == nodes, f"no prolog timing in slurmd's log: {times}"
    assert max(times.values()) < PROLOG_TIMEOUT / 3, f"prolog took {times} (a daemon holding slurmd's pipe?)"
    assert info["JobState"] == "RUNNING"
    release(lab, job)
    wait_done(lab, job)
    for node in nodes:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
