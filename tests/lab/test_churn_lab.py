"""The short soak (issue 43): a seeded churn of jobs with faults on a lab of 12 trays, checked by the oracle.

A lab of its own (tests/lab/churn.py: its own names, so the shared 4-tray lab may be up beside it), 12 trays in
two topology blocks of 6 made by ``imexctl topology blocks``, under ``topology/block``; 36 exclusive jobs of 1 to
12 trays placed by slurmctld, at most 5 alive at once: some cancelled while their prologs run, some timed out, a
tenth meeting a fault (a tray whose daemon never gets ready; a daemon killed mid-job). The oracle then finds
nothing: only the faulted trays drained, each with its code, nothing left anywhere, no channel number held
twice at once in a clique, every script after its domain was UP, every job not cancelled ran. The churn stops
submitting after 200 s (a loaded machine runs fewer jobs), so the test takes about 4 to 5 minutes.

It runs on 26.05 only: a soak per CI run is what the run's time allows, and 26.05 is the newest Slurm the lab
has; ``python -m tests.lab churn --slurm 24.11`` runs it on 24.11 by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.lab import debroot
from tests.lab.churn import NAMES, Mix, faults_met, soak, summary
from tests.lab.cluster import LabUnavailable
from tests.lab.conftest import SLURMS, _host_problems, _unavailable
from tests.lab.versions import RootSlurm

pytestmark = pytest.mark.slurm

VERSION = "26.05"
SEED = 4301
TRAYS, BLOCK = 12, 6
JOBS = 36
MIX = Mix(fault_rate=0.1, cancel_rate=0.1, time_limit_rate=0.05, requeue_rate=0.0, max_sleep_s=6, big=0.25)


@pytest.fixture
def fresh() -> None:
    """This module's test brings up a lab of its own: the shared lab's per-test reset (conftest.py) is not wanted."""


@pytest.mark.parametrize("version", SLURMS, ids=SLURMS)
def test_short_soak_drains_only_faulted_trays_and_leaves_nothing(version: str, tmp_path: Path) -> None:
    """36 jobs with cancels, time limits and 4 faults on 12 trays: both kinds met, and the oracle finds nothing."""
    if version != VERSION:
        pytest.skip(f"the short soak runs on {VERSION} only (one soak per CI run); this is {version}")
    problems = _host_problems()
    if problems:
        _unavailable("; ".join(problems))
    root = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True), suite=debroot.SUITES[version])
    logs = tmp_path / "logs"
    try:
        outcome = soak(
            RootSlurm(root.path, NAMES[version]),
            trays=TRAYS,
            block=BLOCK,
            blocks=True,
            jobs=JOBS,
            seed=SEED,
            mix=MIX,
            inflight=5,
            churn_s=200,
            settle_s=90,
            logs=logs,
        )
    except LabUnavailable as exc:
        _unavailable(str(exc))
    report = summary(outcome)
    print(report)
    met = faults_met(outcome.evidence)
    assert set(met) == {"never_ready", "kill_daemon"}, f"the soak did not meet both kinds of fault:\n{report}"
    assert not outcome.findings, f"{report}\nthe lab's logs: {logs if os.path.isdir(logs) else 'not saved'}"
