"""scancel while the prologs run: no node drains, nothing is left, the job stays cancelled (issue 9).

One tray starts slowly (the simulator's ``slow_start``). When it finally sees the domain UP its prolog
exits 0 and, the job being cancelled, its epilog stops its daemon at once; the other trays, which poll
less often by then, may miss the short time the domain was UP (the race issue 9 reports). The tests make
that certain: the slow tray's command port also refuses the others (``block_cmd``), so only the slow
tray ever sees the domain UP. The others time out and, before they fail, ask slurmctld: the job is
cancelled or completing, so they roll back, log ``prolog.job_ended`` and exit 0. Without the cancel they
would fail, and be drained. slurmd waits for a running prolog before it runs the epilog on that
node; it never kills a prolog for a cancel (seen on both versions).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    JOB_TIMEOUT,
    UID,
    USER,
    diagnose,
    events,
    hold_script,
    imexctl_settings,
    leftovers,
    prolog_processes,
    read_steps,
    sbatch,
    step_argv,
)
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

SLOW = "node4"
# short enough to keep the test quick, long enough for the slow tray (SLOW_START) to come up
DEADLINE_S = 6
SLOW_START_S = 2
FAULTS = f"@{{addr}} slow_start={SLOW_START_S}\n@{{addr}} block_cmd\n"


def _all_prologs_running(lab: SlurmLab, job: int) -> bool:
    return len({p["env"].get("SLURMD_NODENAME") for p in prolog_processes(job)}) == len(NODES)


def _all_daemons_started(lab: SlurmLab, job: int) -> bool:
    return all(events(lab, n, job, "imex.daemon.started") for n in NODES)


MOMENTS: dict[str, Callable[[SlurmLab, int], bool]] = {
    "prologs-started": _all_prologs_running,
    "daemons-waiting": _all_daemons_started,
}


def _srun_job(lab: SlurmLab) -> int:
    """Return the id of the lab user's one job (an srun allocation has no id on its command line)."""
    out = lab.run(["squeue", "-h", "-u", USER, "-o", "%i"], check=False).stdout.split()
    return int(out[0]) if len(out) == 1 else 0


def _cancel_and_check(lab: SlurmLab, job: int, when: Callable[[SlurmLab, int], bool]) -> None:
    wait_for(lambda: when(lab, job), JOB_TIMEOUT, 0.02, what=f"job {job}'s prologs to reach the moment")
    assert not any(events(lab, n, job, "prolog.done") for n in NODES), "a prolog ended before the cancel"
    lab.run(["scancel", str(job)])
    done: dict[str, list[dict[str, Any]]] = {}

    def all_done() -> bool:
        done.update({n: events(lab, n, job, "prolog.done") for n in NODES})
        return all(done.values())

    wait_for(all_done, DEADLINE_S + 20, 0.2, what=f"every prolog of job {job} to end")
    ended = []
    for node in NODES:
        last = done[node][-1]
        assert last.get("ok") is True, (
            f"{node}: job {job}'s prolog failed after the cancel: {last}\n{diagnose(lab, job)}"
        )
        if last.get("job_ended"):
            # the distinct "job gone" event, with the state slurmctld reported and the timeout it replaces
            gone = events(lab, node, job, "prolog.job_ended")
            assert gone and gone[-1]["job_state"] in ("CANCELLED", "COMPLETING"), f"{node}: {gone}"
            assert "not ready" in gone[-1]["reason"], f"{node}: {gone}"
            assert events(lab, node, job, "prolog.rolled_back"), f"{node}: no roll-back before exit 0"
            ended.append(node)
        else:
            assert last.get("ready") is True, f"{node}: {last}"
    assert ended == [n for n in NODES if n != SLOW], f"trays of job {job} that logged prolog.job_ended: {done}"
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 30, 0.2, what="the epilogs")
    info = lab.job(job)
    assert info.get("JobState") == "CANCELLED" and info.get("Restarts") == "0", info
    states = lab.node_states()
    assert all(st["state"] == "idle" for st in states.values()), f"nodes after job {job} was cancelled: {states}"
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job} was cancelled"
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_scancel_of_a_batch_job_during_its_prologs(lab: SlurmLab, moment: str) -> None:
    """A batch job cancelled while its prologs run (slow tray) drains nothing and leaves nothing."""
    lab.faults.write_text(FAULTS.format(addr=lab.addr(SLOW)))
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(DEADLINE_S)}}):
        job = sbatch(lab, hold_script(lab), NODES)
        _cancel_and_check(lab, job, MOMENTS[moment])
    assert not (lab.dir / "out" / f"started-{job}").exists(), "the batch script of a cancelled job ran"


def test_scancel_of_an_srun_job_during_its_prologs(lab: SlurmLab) -> None:
    """An srun job cancelled while its prologs wait for the slow tray: srun fails, no step runs, no drain."""
    lab.faults.write_text(FAULTS.format(addr=lab.addr(SLOW)))
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(DEADLINE_S)}}):
        srun = lab.spawn(step_argv(lab, NODES), user=UID)
        try:
            job = wait_for(lambda: _srun_job(lab), JOB_TIMEOUT, 0.05, what="srun's job")
            _cancel_and_check(lab, job, _all_daemons_started)
        finally:
            out, err = srun.communicate(timeout=JOB_TIMEOUT)
    assert srun.returncode != 0, f"srun of cancelled job {job} succeeded:\n{out}\n{err}"
    assert read_steps(lab, NODES[:1]) is None, "a step of the cancelled job ran"
