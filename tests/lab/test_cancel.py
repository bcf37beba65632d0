"""scancel while the prologs run: no node drains, nothing is left, the job stays cancelled (issue 9).

One tray starts slowly (the simulator's ``slow_start``). When it finally sees the domain UP its prolog
exits 0 and, the job being cancelled, its epilog stops its daemon at once; the other trays, which poll
less often by then, may miss the short time the domain was UP (the race issue 9 reports). The tests make
that certain: the slow tray's command port also refuses the others (``block_cmd``), so only the slow
tray ever sees the domain UP. The others time out and, before they fail, ask slurmctld: the job is
cancelled or completing, so they roll back, log ``prolog.job_ended`` and exit 0. Without the cancel they
would fail, and be drained. slurmd waits for a running prolog before it runs the epilog on that
node; it never kills a prolog for a cancel (seen on both versions).

Issue 41: the slow tray itself, whose view says "the others connected to each other, none to this tray" (its
own fault, by that view) once the cancel has taken its peers away, must ask slurmctld too before it fails,
under the issue's ``PrologFlags=Alloc,Contain`` and under the README's with Contain.
"""

from __future__ import annotations

from collections.abc import Iterator
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


# ---------------------------------------------------------------- issue 41: the slow tray blames itself

#: the issue's PrologFlags (no DeferBatch: healthy trays ask once) and the README's with Contain
FLAGS_41 = ("Alloc,Contain", "Alloc,Contain,DeferBatch")
#: the simulator's slow tray takes the others' links while INITIALIZING, so they would reach it early; the others
#: refusing it makes its view certain: the other trays connected to each other, none of them to it.  Their prologs
#: wait for it in vain (it answers -N, so their verdict blames no one of their own), the slow tray's verdict is its
#: own fault (verdict.py ``_left_out``), and the cancel takes everybody's reason to fail away.
FAULTS_41 = "@{slow} slow_start={start}\n" + "".join(f"@{{n{i}}} refuse_peer={{slow}}\n" for i in (1, 2, 3))


@pytest.fixture(params=FLAGS_41)
def prolog_flags(lab: SlurmLab, request: pytest.FixtureRequest) -> Iterator[str]:
    """The lab's Slurm restarted with these PrologFlags for one test, then with the README's again."""
    before = lab.prolog_flags
    lab.restart(lab.extra_conf, lab.extra_etc, prolog_flags=request.param)
    try:
        yield request.param
    finally:
        _settle(lab)  # a failed test may leave a requeued job and a drained tray: restart waits for idle nodes
        lab.restart(lab.extra_conf, lab.extra_etc, prolog_flags=before)


def _settle(lab: SlurmLab) -> None:
    """Cancel every job until the queue is empty and resume every tray that is not idle."""

    def empty() -> bool:
        if not lab.run(["squeue", "-h"], check=False).stdout.strip():
            return True
        lab.run(["scancel", "--user", USER], check=False)
        return False

    wait_for(empty, 60, 0.5, what="the queue to drain")
    for node, st in lab.node_states().items():
        if st["state"] != "idle":
            lab.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


def _check_no_tray_drained(lab: SlurmLab, job: int) -> None:
    """Every prolog of the cancelled job exited 0 for the job's end, the slow tray's without blaming its ports;
    the job stays cancelled (never requeued); no tray is drained; nothing is left anywhere."""
    done: dict[str, list[dict[str, Any]]] = {}

    def all_done() -> bool:
        done.update({n: events(lab, n, job, "prolog.done") for n in NODES})
        return all(done.values())

    wait_for(all_done, DEADLINE_S + 30, 0.2, what=f"every prolog of job {job} to end")
    for node in NODES:
        last = done[node][-1]
        assert last.get("ok") is True and last.get("job_ended"), (
            f"{node}: job {job}'s prolog did not exit 0 for the cancel: {last}\n{diagnose(lab, job)}"
        )
        (gone,) = events(lab, node, job, "prolog.job_ended")
        assert gone["job_state"] in ("CANCELLED", "COMPLETING"), f"{node}: {gone}"
    (slow,) = events(lab, SLOW, job, "prolog.job_ended")
    for blame in ("none of them to this tray", "check this tray", "firewall", "incoming"):
        assert blame not in slow["reason"], f"{SLOW} blames itself for the cancel: {slow}"
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 30, 0.2, what="the epilogs")
    info = lab.job(job)
    assert info.get("JobState") == "CANCELLED" and info.get("Restarts") == "0", f"{info}\n{diagnose(lab, job)}"
    states = lab.node_states()
    assert all(st["state"] == "idle" for st in states.values()), f"nodes after job {job} was cancelled: {states}"
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job} was cancelled"
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"


def test_a_cancel_drains_not_the_slow_tray_that_blames_itself(lab: SlurmLab, prolog_flags: str) -> None:
    """Issue 41: a batch job cancelled while its prologs wait for the slow tray, once at each moment: the slow tray,
    whose view says the others formed the domain without it, asks slurmctld before it fails, sees the job over
    (COMPLETING with the restart count its run started with, or CANCELLED), and exits 0; no tray is drained and
    slurmctld does not requeue the cancelled job."""
    others = {f"n{i}": lab.addr(f"node{i}") for i in (1, 2, 3)}
    lab.faults.write_text(FAULTS_41.format(slow=lab.addr(SLOW), start=SLOW_START_S, **others))
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(DEADLINE_S)}}):
        for moment in sorted(MOMENTS):
            job = sbatch(lab, hold_script(lab), NODES)
            wait_for(lambda: MOMENTS[moment](lab, job), JOB_TIMEOUT, 0.02, what=f"job {job}'s prologs: {moment}")
            assert not any(events(lab, n, job, "prolog.done") for n in NODES), "a prolog ended before the cancel"
            lab.run(["scancel", str(job)])
            _check_no_tray_drained(lab, job)
            assert not (lab.dir / "out" / f"started-{job}").exists(), f"{prolog_flags}: job {job}'s script ran"
