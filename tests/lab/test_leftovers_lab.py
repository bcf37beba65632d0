"""Leftovers of a job that no longer runs clear themselves, under the real slurmd (issue 22).

Job A's daemon is killed mid-job, and A's epilog cannot finish (the test holds the tray's node lock, so
the epilog gives up after ``[daemon] lock_timeout_s``, as one killed at its timeout would): A's directory
stays. Slurm drains the tray once, for the failed epilog, as it always does. After the resume the next
job on the tray starts: its prolog finds A's leftovers, sees that A no longer runs there, tears them down
and sets up its own domain. No second drain, and no ``imexctl cleanup`` by an admin.

Issue 32: slurmctld's RUNNING is believed only for this tray. Job A runs on node2 (an allocation without a
step, so nothing of it shows on a tray), and node1 holds a set-up domain of A's with its daemon running, as
an earlier run of A on node1 whose epilog never ran would leave it (made by running A's prolog there by
hand). The next job on node1 asks slurmctld about A: RUNNING, on node2 only, so the leftovers are cleared
and the job starts; A's domain on node2 is left alone.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    GID,
    IMEXCTL,
    UID,
    USER,
    events,
    hold_script,
    imexctl_settings,
    job_dir,
    leftovers,
    release,
    sbatch,
    sim_processes,
    wait_done,
    wait_started,
    wait_state,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

TRAY = NODES[0]


def test_next_job_clears_what_a_job_with_a_lost_epilog_left(lab: SlurmLab) -> None:
    """A's daemon killed, A's epilog failed on the lock: after the resume, B's prolog clears A and B runs."""
    with imexctl_settings(lab, {"daemon": {"lock_timeout_s": "2"}}):
        a = sbatch(lab, hold_script(lab), [TRAY])
        wait_started(lab, a)
        (pid, _), *_ = sim_processes(lab, TRAY, a)
        os.kill(pid, signal.SIGKILL)
        lock = lab.node_root(TRAY) / "run/imexctl/lock"
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            release(lab, a)
            done = wait_for(lambda: events(lab, TRAY, a, "epilog.done"), 60, 0.2, what=f"job {a}'s epilog")
        finally:
            os.close(fd)
        assert done[-1]["ok"] is False and done[-1]["error_code"] == "lock_timeout", done[-1]
        assert job_dir(lab, TRAY, a).exists(), "the failed epilog should have left job A's directory"
        wait_for(lambda: lab.node_states()[TRAY]["state"].startswith("drain"), 30, 0.5, what="the epilog drain")
        lab.run(["scontrol", "update", f"nodename={TRAY}", "state=resume"])
        lab.wait_idle([TRAY])
        b = sbatch(lab, "true", [TRAY])
        wait_done(lab, b)
    prolog = events(lab, TRAY, b, "prolog.done")[-1]
    assert prolog["ok"] is True and prolog.get("trays") == 1, prolog
    removed = events(lab, TRAY, b, "state.removed")
    assert removed and f"leftovers of job {a}" in removed[-1]["reason"], removed
    assert lab.node_states()[TRAY]["state"] == "idle", lab.node_states()[TRAY]
    assert not job_dir(lab, TRAY, a).exists() and leftovers(lab, TRAY) == []


def test_running_elsewhere_is_no_live_domain_here(lab: SlurmLab) -> None:
    """A RUNNING on node2 only; A's leftovers on node1: B's prolog on node1 clears them (slurmctld's answer names
    node2), exits 0 and node1 is not drained; A's own domain on node2 stays up."""
    other = NODES[1]
    res = lab.run(["salloc", "--no-shell", "-N1", "-w", other, "--exclusive"], user=UID, timeout=60)
    a = int(re.findall(r"Granted job allocation (\d+)", res.stderr)[0])
    wait_state(lab, a, ["RUNNING"], 60)
    wait_for(lambda: events(lab, other, a, "prolog.done"), 60, 0.2, what=f"job {a}'s prolog on {other}")
    there = sim_processes(lab, other, a)
    assert len(there) == 1, there
    env = {
        "SLURM_JOB_ID": str(a), "SLURMD_NODENAME": TRAY, "SLURM_JOB_NODELIST": TRAY, "SLURM_NODELIST": TRAY,
        "SLURM_JOB_UID": str(UID), "SLURM_JOB_GID": str(GID), "SLURM_JOB_USER": USER, "SLURM_JOB_PARTITION": "debug",
        "SLURM_JOB_OVERSUBSCRIBE": "NO", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_CONF": str(lab.slurm.path_inside(lab.conf)),
    }  # fmt: skip
    left = lab.node_exec(TRAY, [str(IMEXCTL), "prolog"], env=env, check=False, timeout=90)
    assert left.returncode == 0 and sim_processes(lab, TRAY, a), left.stdout + left.stderr
    b = sbatch(lab, "true", [TRAY])
    wait_done(lab, b)
    prolog = events(lab, TRAY, b, "prolog.done")[-1]
    assert prolog["ok"] is True, prolog
    removed = events(lab, TRAY, b, "state.removed")
    assert removed and f"leftovers of job {a}" in removed[-1]["reason"], removed
    assert f"runs on {other}, not on this tray" in removed[-1]["reason"], removed
    assert not job_dir(lab, TRAY, a).exists() and sim_processes(lab, TRAY, a) == []
    assert lab.node_states()[TRAY]["state"] == "idle", lab.node_states()[TRAY]
    assert sim_processes(lab, other, a) == there and lab.job(a)["JobState"] == "RUNNING"
    lab.run(["scancel", str(a)])
    wait_state(lab, a, ["CANCELLED"], 60)
    wait_for(lambda: events(lab, other, a, "epilog.done"), 60, 0.2, what=f"job {a}'s epilog on {other}")
    for node in (TRAY, other):
        assert leftovers(lab, node) == [], f"{node} not clean"
