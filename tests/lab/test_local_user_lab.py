"""Under the real slurmd of each version: imexctl knows a real slurmstepd, and a local user's fake is none (issue 33).

imexctl counts a job as running on a tray when a process of root's, whose
executable is named ``slurmstepd``, is titled ``[<job>.<step>``
(``RealHost.job_is_running``, design.md source ``slurmstepd-identity``).
The lab's slurmstepd runs from the host's Slurm (22.05) or from a Debian
root (24.11, 26.05, with the hooks chrooted there): its executable's path
differs, its name does not.  A local user's symlink named ``slurmstepd``
titled like the job's step is no slurmstepd, in the same lab.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import hold_script, imexctl_admin, release, sbatch, wait_done, wait_started
from tests.simhelpers import wait_for
from tests.support.localuser import spawn_as_user, user_ids

pytestmark = pytest.mark.slurm

TRAY = NODES[0]


def _steps(job: int) -> list[tuple[int, str, str, int, str]]:
    """The job's step daemons as the kernel shows them: (pid, comm, exe, real uid, title)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/cmdline").read_bytes()[:4096]
            if f"[{job}.".encode() not in raw:
                continue
            comm = Path(f"/proc/{name}/comm").read_text().strip()
            exe = os.readlink(f"/proc/{name}/exe")
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
        out.append((int(name), comm, exe, uid, raw.replace(b"\0", b" ").decode(errors="replace").strip()))
    return out


def test_a_running_jobs_slurmstepd_counts_and_a_users_fake_does_not(lab: SlurmLab) -> None:
    """While job A runs, cleanup on its tray says A still runs (its slurmstepd); a user's fake for gone job B is none."""
    a = sbatch(lab, hold_script(lab), [TRAY])
    fake = None
    public = Path(tempfile.mkdtemp(prefix="imxl", dir="/tmp"))
    try:
        wait_started(lab, a)
        steps = _steps(a)
        print(f"slurmstepd of job {a} ({lab.version}): {steps}")
        # Debian's is /usr/sbin/slurmstepd-wlm (slurmd runs it through the /usr/sbin/slurmstepd symlink: comm)
        names = {os.path.basename(exe) for _, _, exe, _, _ in steps}
        assert steps and all(uid == 0 and comm == "slurmstepd" for _, comm, _, uid, _ in steps), steps
        assert names <= {"slurmstepd", "slurmstepd-wlm"}, steps
        kept = imexctl_admin(lab, TRAY, "cleanup")
        assert f"skipped: job {a} still runs on this node" in kept.stdout, kept.stdout + kept.stderr
        if user_ids() is not None:
            public.chmod(0o755)
            (public / "slurmstepd").symlink_to("/bin/sh")
            gone = a + 1000  # a job that left its directory here and runs nowhere
            (lab.node_root(TRAY) / f"run/imexctl/jobs/{gone}").mkdir(mode=0o755)
            fake = spawn_as_user([str(public / "slurmstepd"), "-c", "sleep 600; :", f"[{gone}.extern]"])
            wait_for(lambda: f"[{gone}.".encode() in Path(f"/proc/{fake.pid}/cmdline").read_bytes(), 30, 0.05)
            done = imexctl_admin(lab, TRAY, "cleanup", "--job", str(gone))
            assert "skipped" not in done.stdout and f"job {gone}" in done.stdout, done.stdout + done.stderr
            assert not (lab.node_root(TRAY) / f"run/imexctl/jobs/{gone}").exists()
    finally:
        if fake is not None:
            fake.kill()
            fake.wait()
        shutil.rmtree(public, ignore_errors=True)
        release(lab, a)
    wait_done(lab, a)
