"""Is this job gone: a typed answer (``Liveness``), decided on the tray, and slurmctld asked in its doubt in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.hooks.jobs import GONE, Liveness, still_runs, still_runs_here
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, job_env

#: the run job 7's prolog was: its restart count and start time as slurmd gave them
RUN = {"SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_START_TIME": "1796434004"}


@pytest.fixture
def left(host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> tuple[Runtime, str]:
    """Job 7's set-up domain on gb01, its daemon running, no slurmstepd here: the tray's evidence is in doubt."""
    rt = Runtime(host, FakeGpu(), make_settings(), structlog.get_logger())
    conf = root / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    assert prolog(job_env(job_id=7, SLURM_CONF=str(conf), **RUN), rt).ok
    return rt, str(conf)


def _asked(host: FakeHost) -> list[str]:
    return [c[5] for c in host.calls if c[0].endswith("squeue")]


def test_in_doubt_slurmctld_decides_and_says_why(left: tuple[Runtime, str], host: FakeHost) -> None:
    """The tray cannot tell (runs, not seen); slurmctld's PENDING makes the job gone here, and the answer says so."""
    rt, conf = left
    assert still_runs(7, rt) == Liveness(True, False, still_runs(7, rt).why) and not still_runs(7, rt).seen
    host.slurm_jobs[7] = SlurmJob(7, state="PENDING", nodes="", start_time=1796434004)
    assert still_runs_here(7, rt, node="gb01", slurm_conf=conf) == Liveness(False, why="slurmctld says PENDING")
    assert _asked(host) == ["--jobs=7"]


def test_what_the_tray_knows_is_never_asked(left: tuple[Runtime, str], host: FakeHost) -> None:
    """A slurmstepd of the job (seen), a job gone by the tray's own evidence, or no SLURM_CONF: nobody is asked."""
    rt, conf = left
    host.slurm_jobs[7] = SlurmJob(7, state="COMPLETED", nodes="gb[01-02]", start_time=1796434004)
    assert still_runs_here(7, rt, node="gb01", slurm_conf="") == still_runs(7, rt)
    host.running_jobs.add(7)
    assert still_runs_here(7, rt, node="gb01", slurm_conf=conf) == Liveness(True, True, "still runs on this node")
    assert still_runs_here(8, rt, node="gb01", slurm_conf=conf) is GONE
    assert _asked(host) == []


def test_no_answer_keeps_the_tray_s_doubt(left: tuple[Runtime, str], host: FakeHost) -> None:
    """slurmctld does not know the job: the tray's answer stands (the job may still run)."""
    rt, conf = left
    assert still_runs_here(7, rt, node="gb01", slurm_conf=conf) == still_runs(7, rt)
    assert still_runs(7, rt).runs and _asked(host) == ["--jobs=7"]
