"""What real slurmd leaves at epilog time, and the epilog's wait for it (issue 33 §2, design.md source imex-abrupt-shutdown).

slurmd runs the epilog once every step of the job has ended (design.md source slurm-epilog-order); what
Slurm does not track outlives the job. The lab runs ``proctrack/linuxproc``, which follows a step's
processes by their parents, so a process that leaves its session (``setsid -f``) escapes it, as a process
started outside Slurm's steps would on a real tray. Here it holds a file named like the NVIDIA driver's
(``/dev/nvidia-imexlab-*``, the lab has no driver), which is what makes it a driver client to the epilog.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import events, imexctl_settings, iso_time, leftovers, sbatch, wait_done
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

TRAY = NODES[0]


@pytest.fixture
def driver_file() -> Iterator[Path]:
    """A file under /dev that the lab user may open (the lab roots bind-mount the host's /dev)."""
    path = Path(f"/dev/nvidia-imexlab-{os.getpid()}")
    path.write_text("")
    path.chmod(0o644)
    yield path
    path.unlink()


def _straggler_job(lab: SlurmLab, dev: Path, seconds: int | None) -> tuple[int, Path]:
    """A one-tray batch job that leaves one process holding ``dev``: for ``seconds`` after the job (then it writes
    out/straggler-end-<job> and exits), or until killed (None); the path of its pid file."""
    out = lab.dir / "out"
    end = f"sleep {seconds} 3<&-; date +%s.%N > {out}/straggler-end-$SLURM_JOB_ID" if seconds else "exec sleep 300"
    script = (
        f"setsid -f sh -c 'exec 3<{dev}; echo $$ > {out}/straggler-$SLURM_JOB_ID; {end}' </dev/null >/dev/null 2>&1; "
        f"while [ ! -s {out}/straggler-$SLURM_JOB_ID ]; do sleep 0.05; done"
    )
    job = sbatch(lab, script, [TRAY])
    return job, out / f"straggler-{job}"


def test_the_daemon_stops_after_a_straggler_holding_the_driver_has_ended(lab: SlurmLab, driver_file: Path) -> None:
    """The straggler outlives the job by about 4 s: the epilog (run by slurmd after the job's step ended) waits
    for it, stops the daemon only after it ended, and reports no busy stop."""
    job, _ = _straggler_job(lab, driver_file, 4)
    wait_done(lab, job)
    end = float((lab.dir / "out" / f"straggler-end-{job}").read_text())
    (done,) = events(lab, TRAY, job, "epilog.done")
    stopped = events(lab, TRAY, job, "imex.daemon.stopped")
    assert done["ok"] and "busy_stop" not in done and stopped, done
    assert iso_time(stopped[-1]["timestamp"]) >= end, (stopped[-1]["timestamp"], end)
    assert not events(lab, TRAY, job, "imex.daemon.stop_busy")
    assert leftovers(lab, TRAY) == []


def test_a_straggler_that_stays_is_waited_for_then_reported(lab: SlurmLab, driver_file: Path) -> None:
    """A straggler that stays: the epilog waits [daemon] process_wait_s (3 s here), stops the daemon all the
    same, names the process (imex.daemon.stop_busy) and lists the stop in epilog.done; the process is not touched."""
    with imexctl_settings(lab, {"daemon": {"process_wait_s": "3"}}):
        job, pid_file = _straggler_job(lab, driver_file, None)
        pid = int(wait_for(lambda: pid_file.read_text().strip() if pid_file.exists() else "", 30, 0.1))
        try:
            wait_done(lab, job)
            (busy,) = events(lab, TRAY, job, "imex.daemon.stop_busy")
            assert busy["pids"] == [pid] and 2.5 <= busy["waited_s"] < 4.5, busy
            (done,) = events(lab, TRAY, job, "epilog.done")
            assert done["ok"] and len(done["busy_stop"]) == 1 and str(pid) in done["busy_stop"][0], done
            assert os.path.exists(f"/proc/{pid}")  # imexctl ends no process of the user's
            assert leftovers(lab, TRAY) == []
        finally:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
