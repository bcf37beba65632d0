"""The job's channel in its tasks and containers under real Slurm (issue 15; docs/containers.md "Lab tests").

- ``TaskProlog=hooks/task-prolog`` (set in the lab's slurm.conf): every task of a job with a domain
  gets ``NVIDIA_IMEX_CHANNELS=<the job's minor>``; a job without a channel gets nothing; in a het job
  that srun allocates, each task gets the joint domain's minor, or its component's (``per_component``).
- A containerised batch job, through the route docs/containers.md recommends (enroot's hook
  ``hooks/enroot/99-imexctl.sh``, i.e. ``python -m imexctl.enroothook``): enroot and Pyxis are not
  packaged for Debian, so the job runs the emulation of tests/support/enrootemu.py as the job's
  user (``unshare --user --map-current-user --keep-caps --mount``), not Pyxis. 22.05 only: the
  24.11 lab runs Slurm and its jobs in a chroot, where the kernel refuses unprivileged user
  namespaces (user_namespaces(7), EPERM).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.lab.cluster import REPO, SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import UID, channel_dir, events, imexctl_settings, leftovers, sbatch, wait_done

pytestmark = pytest.mark.slurm

PRINT = 'echo "job=$SLURM_JOB_ID channels=${NVIDIA_IMEX_CHANNELS-unset}"'

ENROOTSTEP = r"""
# a batch job as the job's user: start a container like enroot would, report what it sees
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path
from tests.support import enrootemu
lab, node, job = sys.argv[1], os.environ["SLURMD_NODENAME"], os.environ["SLURM_JOB_ID"]
work = Path(tempfile.mkdtemp(prefix=f"enroot-{job}-"))
(work / "rootfs" / "dev").mkdir(parents=True)
env = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_CONF")}
spec = enrootemu.write_spec(rootfs=work / "rootfs", host_dev=Path(f"{lab}/nodes/{node}/dev"), workdir=work, env=env)
run_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ["PYTHONPATH"], "LANG": "C.UTF-8"}
r = subprocess.run(enrootemu.user_namespace_argv(spec), capture_output=True, text=True, timeout=60, env=run_env)
out = {"rc": r.returncode, "stderr": r.stderr[-2000:], "report": json.loads(r.stdout) if r.returncode == 0 else None}
shutil.rmtree(work, ignore_errors=True)
with open(f"{lab}/out/enroot-{job}.json", "w") as fh:
    json.dump(out, fh)
"""


def _task_lines(lab: SlurmLab, nodes: list[str], debug: bool) -> tuple[int, list[str]]:
    """Run ``PRINT`` in one task per node of a new job; return (job id, the tasks' output lines)."""
    env = {"IMEXCTL_TASK_PROLOG_DEBUG": "1"} if debug else {}
    argv = ["srun", "-N", str(len(nodes)), "-w", ",".join(nodes), "-t", "5", "/bin/sh", "-c", PRINT]
    res = lab.run(argv, user=UID, env=env, timeout=60, check=False)
    assert res.returncode == 0, f"srun failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    lines = res.stdout.splitlines()
    job = int(next(ln for ln in lines if ln.startswith("job=")).split()[0][4:])
    return job, lines


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_task_prolog_exports_the_jobs_channel(lab: SlurmLab, debug: bool) -> None:
    """Each task of a 2-tray job sees NVIDIA_IMEX_CHANNELS = the job's minor; the debug variable adds nothing."""
    job, lines = _task_lines(lab, NODES[:2], debug)
    minors = {events(lab, n, job, "device.channel.created")[-1]["minor"] for n in NODES[:2]}
    assert len(minors) == 1, minors
    assert sorted(lines) == [f"job={job} channels={minors.pop()}"] * 2, lines
    wait_done(lab, job)


@pytest.mark.parametrize(
    "settings",
    [{"policy": {"channels": "none"}}, {"policy": {"jobs": "partitions", "partitions": "other"}}],
    ids=["channels-none", "policy-skips"],
)
def test_task_prolog_exports_nothing_without_a_channel(lab: SlurmLab, settings: dict[str, dict[str, str]]) -> None:
    """A job without a channel (channels = none, or skipped by policy): unset, the task runs, one debug line."""
    with imexctl_settings(lab, settings):
        job, lines = _task_lines(lab, NODES[:2], debug=True)
    assert sorted(ln for ln in lines if ln.startswith("job=")) == [f"job={job} channels=unset"] * 2, lines
    why = [ln for ln in lines if ln.startswith("imexctl: no IMEX channel exported: ")]
    assert len(why) == 2, lines
    wait_done(lab, job)


def _container_job(lab: SlurmLab, node: str) -> tuple[int, dict[str, Any]]:
    """Run the enroot emulation as a one-tray batch job on ``node``; return (job id, its report)."""
    src = lab.slurm.path_inside(REPO)
    wrap = f"cd {src} && PYTHONPATH={src} exec /opt/imexctl/bin/python {lab.dir}/bin/enrootstep.py {lab.dir}"
    job = sbatch(lab, wrap, [node])
    wait_done(lab, job)
    out = lab.dir / "out" / f"enroot-{job}.json"
    assert out.exists(), f"job {job} wrote no report: {(lab.dir / 'out' / f'{job}.out').read_text()}"
    return job, dict(json.loads(out.read_text()))


def test_containerised_job_sees_exactly_its_own_channel(lab: SlurmLab) -> None:
    """Two one-tray jobs, each in an emulated enroot container: only its own channel, a decoy hidden."""
    if lab.version_info >= (24, 0):
        pytest.skip("the 24.11 lab runs jobs in a chroot: the kernel refuses unprivileged user namespaces there")
    (lab.dir / "bin" / "enrootstep.py").write_text(ENROOTSTEP)
    os.chmod(lab.dir / "bin" / "enrootstep.py", 0o644)
    decoys = {n: channel_dir(lab, n) / "channel7" for n in NODES[:2]}
    try:
        for path in decoys.values():
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mknod(path, 0o600 | 0o020000, os.makedev(234, 7))
        for node in NODES[:2]:
            job, out = _container_job(lab, node)
            assert out["rc"] == 0 and out["report"]["rc"] == 0, out
            minor = events(lab, node, job, "device.channel.created")[-1]["minor"]
            view = out["report"]["view"]
            assert [(e["name"], e["char"], e["major"], e["minor"], e["host_uid"], e["mode"]) for e in view] == [
                (f"channel{minor}", True, 234, minor, UID, 0o600)
            ], view
            assert out["report"]["environ"].rstrip("\n").endswith(f"NVIDIA_IMEX_CHANNELS={minor}"), out
        with imexctl_settings(lab, {"policy": {"channels": "none"}}):
            job, out = _container_job(lab, NODES[0])
        assert out["rc"] == 0 and out["report"]["rc"] == 0, out
        assert [e["name"] for e in out["report"]["view"]] == ["channel7"], f"job {job} without a channel: {out}"
    finally:
        for path in decoys.values():
            path.unlink(missing_ok=True)
    for node in NODES[:2]:
        assert leftovers(lab, node) == [], f"{node} not clean"


HET_PRINT = (
    'echo "node=$SLURMD_NODENAME job=$SLURM_JOB_ID channels=${NVIDIA_IMEX_CHANNELS-unset} '
    'groups=$(env | grep ^SLURM_JOB_ID_ | sort | tr "\\n" " ")"'
)


@pytest.mark.parametrize("mode", ["joint", "per_component"])
def test_task_prolog_in_a_het_job(lab: SlurmLab, mode: str) -> None:
    """srun over two components: joint, every task sees the leader's channel; per component, its component's."""
    first, second = NODES[:2], NODES[2:]
    argv = ["srun", "-N2", "-w", ",".join(first), "-t", "5", "/bin/sh", "-c", HET_PRINT, ":"]
    argv += ["-N2", "-w", ",".join(second), "-t", "5", "/bin/sh", "-c", HET_PRINT]
    with imexctl_settings(lab, {"slurm": {"het_jobs": mode}}):
        res = lab.run(argv, user=UID, env={"IMEXCTL_TASK_PROLOG_DEBUG": "1"}, timeout=60, check=False)
    assert res.returncode == 0, f"srun failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    tasks = {}
    for line in res.stdout.splitlines():
        if line.startswith("node="):
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f and not f.startswith("SLURM_"))
            tasks[fields["node"]] = (fields, line)
    assert sorted(tasks) == NODES, res.stdout
    leader = int(tasks[first[0]][0]["job"])
    minors = {}
    for node in NODES:
        fields, line = tasks[node]
        comp = leader if node in first else leader + 1
        created = [r for r in events(lab, node, None, "device.channel.created") if r["job_id"] in (leader, comp)]
        assert len(created) == 1, f"{node}: channels made for het job {leader}: {created}"
        assert fields["job"] == str(leader), f"{node}: the task's SLURM_JOB_ID is not the leader's: {line}"
        # srun's own het allocation names the component ids SLURM_JOB_ID_PACK_GROUP_<n> (22.05 and 24.11)
        groups = {f"SLURM_JOB_ID_{kind}_GROUP_1={leader + 1}" for kind in ("HET", "PACK")}
        assert groups & set(line.split()), f"{node}: no group variable names component {leader + 1}: {line}"
        assert fields["channels"] == str(created[0]["minor"]), f"{node}: {line}\n{res.stdout}"
        minors.setdefault(comp, set()).add(created[0]["minor"])
    assert all(len(m) == 1 for m in minors.values()), f"minors of het job {leader} per component: {minors}"
    joint = minors[leader] == minors[leader + 1]
    assert joint == (mode == "joint"), f"het_jobs = {mode}: minors per component {minors}"
    wait_done(lab, leader)
    wait_done(lab, leader + 1)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after het job {leader}"
