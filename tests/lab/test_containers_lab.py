"""The job's channel in its tasks and containers under real Slurm (issue 15; docs/containers.md "Lab tests").

- ``TaskProlog=hooks/task-prolog`` (set in the lab's slurm.conf): every task of a job with a domain
  gets ``NVIDIA_IMEX_CHANNELS=<the job's minor>``; a job without a channel gets nothing; in a het job
  that srun allocates, each task gets the joint domain's minor, or its component's (``per_component``).
- A containerised batch job, through the route docs/containers.md recommends (enroot's hook
  ``hooks/enroot/99-imexctl.sh``, i.e. ``python -m imexctl.channels.enroot``): enroot and Pyxis are not
  packaged for Debian, so the job runs the emulation of tests/support/enrootemu.py as the job's
  user (``unshare --user --map-current-user --keep-caps --mount``), not Pyxis. 22.05 only: the
  24.11 and 26.05 labs run Slurm and its jobs in a chroot, where the kernel refuses unprivileged user
  namespaces (user_namespaces(7), EPERM).
- Apptainer 1.4.5 from the Debian sid root (26.05 only; issue 25): a SIF built from a local directory as
  root in the lab's root; as the job's user in a batch job under slurmd (skipped here with the refusal
  Apptainer and ``unshare --user`` print: the job is chrooted); and beside a running job, as the job's
  user, in the lab's root entered with ``pivot_root`` instead of ``chroot``: the documented lines of
  docs/containers.md ("Apptainer") against the channel the real prolog made and another user's node.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from typing import Any

import pytest

from tests.lab.cluster import REPO, SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    UID,
    channel_dir,
    events,
    hold_script,
    imexctl_settings,
    leftovers,
    release,
    sbatch,
    wait_done,
    wait_started,
)
from tests.lab.procs import SYS_PATH

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


def test_task_prolog_prints_the_enroot_hooks_warning_once_per_tray(lab: SlurmLab) -> None:
    """IMEXCTL_ENROOT_HOOK_WARNING in the tasks' environment (Pyxis copies it from the container): one line per tray."""
    warning = "job 1: channel /dev/nvidia-caps-imex-channels/channel1 is missing; the container starts"
    argv = ["srun", "-N2", "--ntasks-per-node=2", "-w", ",".join(NODES[:2]), "-t", "5", "/bin/true"]
    res = lab.run(argv, user=UID, env={"IMEXCTL_ENROOT_HOOK_WARNING": warning}, timeout=60, check=False)
    assert res.returncode == 0, f"srun failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    assert res.stdout.splitlines().count(f"imexctl: enroot hook: {warning}") == 2, res.stdout


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
        pytest.skip(
            f"the {lab.version} lab runs jobs in a chroot: the kernel refuses unprivileged user namespaces there"
        )
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


# ---------------------------------------------------------------- Apptainer (Debian sid's 1.4.5, Slurm 26.05 lab)

#: run as root in the lab's root: a SIF made from a local directory (the root's sh, ls, cat), no registry
APPTAINER_IMAGE = r"""
set -eu
D=$1/rootfs
rm -rf "$D"
mkdir -p "$D/bin" "$D/dev" "$D/proc" "$D/sys" "$D/tmp" "$D/etc"
for b in /bin/sh /bin/ls /bin/cat; do
  cp -L "$b" "$D/bin/"
  for l in $(ldd "$b" | grep -o '/[^ ]*'); do mkdir -p "$D$(dirname "$l")"; cp -Ln "$l" "$D$l"; done
done
apptainer -s build --force "$1/img.sif" "$D"
chmod 0644 "$1/img.sif"
"""

#: what the container reports, one tagged line each: its channel directory's listing and two open(2) results
CONTAINER_VIEW = (
    'ls -ln /dev/nvidia-caps-imex-channels 2>&1 | while read -r l; do echo "ls $l"; done; '
    'for c in "$0" 7; do e=$(cat /dev/nvidia-caps-imex-channels/channel$c 2>&1 >/dev/null); '
    'echo "open channel$c: ${e##*: }"; done'
)

#: as root on the host, in a private mount namespace: the lab's root entered with pivot_root (not chroot:
#: the kernel refuses unprivileged user namespaces to a chrooted process, and Apptainer's starter refuses a
#: chroot), a /dev of its own holding the tray's channel directory, then Apptainer as the job's user
APPTAINER_BESIDE = r"""
set -eu
M=$1; CH=$2; SIF=$3; N=$4; VIEW=$5
mount -t tmpfs -o mode=0755 tmpfs "$M/dev"
for n in null zero full random urandom tty; do : > "$M/dev/$n"; mount --bind "/dev/$n" "$M/dev/$n"; done
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"
ln -s /proc/self/fd/1 "$M/dev/stdout"
ln -s /proc/self/fd/2 "$M/dev/stderr"
mkdir "$M/dev/pts" "$M/dev/shm" "$M/dev/nvidia-caps-imex-channels"
mount --rbind /dev/pts "$M/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$M/dev/shm"
mount --bind "$CH" "$M/dev/nvidia-caps-imex-channels"
cd "$M"
pivot_root . .
umount -l .
cd /
B=/dev/nvidia-caps-imex-channels/channel$N
for mode in default contain contain-bind bind; do
  case $mode in
    default) opts= ;;
    contain) opts=--contain ;;
    contain-bind) opts="--contain --bind $B" ;;
    bind) opts="--bind $B" ;;
  esac
  echo "=== $mode"
  runuser -u imexlab -- env -i PATH=/usr/bin:/bin HOME=/tmp apptainer -s exec $opts "$SIF" /bin/sh -c "$VIEW" "$N" 2>&1 || echo "exit $?"
done
"""


def _needs_apptainer(lab: SlurmLab) -> None:
    if lab.version_info[:2] != (26, 5):
        pytest.skip(
            "Apptainer comes from the Debian sid root, which only the Slurm 26.05 lab runs "
            "(Debian 12 and 13 have no apptainer package)"
        )


def _sif(lab: SlurmLab) -> str:
    """Build (once per lab) a SIF image from a local directory, as root in the lab's root; return its path."""
    where = lab.dir / "apptainer"
    sif = where / "img.sif"
    if not sif.exists():
        where.mkdir(mode=0o755, exist_ok=True)
        script = lab.dir / "bin" / "apptainer-image.sh"
        script.write_text(APPTAINER_IMAGE)
        res = lab.run(["/bin/sh", str(script), str(where)], env={"HOME": "/root"}, timeout=300, check=False)
        assert res.returncode == 0, f"apptainer build failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return str(sif)


def test_apptainer_builds_a_sif_from_a_local_directory(lab: SlurmLab) -> None:
    """As root in the lab's root, Debian's apptainer 1.4.5 builds a SIF from a directory; the user may run it."""
    _needs_apptainer(lab)
    sif = _sif(lab)
    res = lab.run(["apptainer", "--version"], timeout=30)
    assert res.stdout.strip() == "apptainer version 1.4.5", res.stdout
    res = lab.run(["apptainer", "sif", "list", sif], env={"HOME": "/root"}, timeout=30)
    assert "Squashfs" in res.stdout and "FS" in res.stdout, res.stdout
    assert os.stat(sif).st_mode & 0o004


def test_apptainer_in_a_job_as_the_user(lab: SlurmLab) -> None:
    """As the job's user in a batch job under slurmd: Apptainer starts, or the skip names what the kernel refused."""
    _needs_apptainer(lab)
    sif = _sif(lab)
    out = lab.dir / "out"
    wrap = (
        f"apptainer -s exec {sif} /bin/cat /proc/self/uid_map > {out}/apptainer-$SLURM_JOB_ID.txt 2>&1; "
        f'echo "apptainer_rc=$?" >> {out}/apptainer-$SLURM_JOB_ID.txt; '
        f"unshare --user true >> {out}/apptainer-$SLURM_JOB_ID.txt 2>&1; "
        f'echo "unshare_rc=$?" >> {out}/apptainer-$SLURM_JOB_ID.txt'
    )
    job = sbatch(lab, wrap, [NODES[0]])
    wait_done(lab, job)
    text = (out / f"apptainer-{job}.txt").read_text()
    assert events(lab, NODES[0], job, "device.channel.created"), f"job {job} got no channel"
    if "apptainer_rc=0" not in text:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # apptainer colours its messages
        refused = [ln.strip() for ln in plain.splitlines() if "user namespace" in ln or "unshare failed" in ln]
        assert refused and "unshare_rc=0" not in text, f"apptainer failed for another reason:\n{text}"
        pytest.skip(
            "slurmd 26.05 runs chrooted in this lab and the kernel refuses unprivileged user namespaces to a "
            f"chrooted process (user_namespaces(7)), which Debian's non-setuid apptainer needs: {'; '.join(refused)}"
        )
    assert "unshare_rc=0" in text, text
    assert text.splitlines()[0].split()[:2] == [str(UID), str(UID)], f"the container's uid map:\n{text}"


def _parse_view(text: str) -> dict[str, dict[str, Any]]:
    """``=== mode`` sections of ``CONTAINER_VIEW`` output: entries (name -> (mode, uid, major, minor)) and opens."""
    views: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("=== "):
            current = views[line[4:]] = {"entries": {}, "open": {}, "lines": []}
            continue
        current.setdefault("lines", []).append(line)
        fields = line.split()
        if line.startswith("ls c") and len(fields) >= 7:
            current["entries"][fields[-1]] = (fields[1], int(fields[3]), int(fields[5].rstrip(",")), int(fields[6]))
        elif line.startswith("open channel"):
            name, _, result = line[5:].partition(": ")
            current["open"][name] = result
    return views


def test_apptainer_shows_the_jobs_channel_by_the_documented_lines(lab: SlurmLab) -> None:
    """Beside a running job: the default and --contain + --bind give the job's channel, not another's; --contain none."""
    _needs_apptainer(lab)
    sif = _sif(lab)
    merged = getattr(lab.slurm, "merged", None)
    assert merged is not None, "the 26.05 lab runs from an overlay of its Debian root"
    node = NODES[0]
    decoy = channel_dir(lab, node) / "channel7"  # another user's job's channel: root's, 0600
    script = lab.dir / "bin" / "apptainer-beside.sh"
    script.write_text(APPTAINER_BESIDE)
    job = sbatch(lab, hold_script(lab), [node])
    try:
        wait_started(lab, job)
        minor = events(lab, node, job, "device.channel.created")[-1]["minor"]
        os.mknod(decoy, 0o600 | stat.S_IFCHR, os.makedev(234, 7))
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", str(script), str(merged)]
        argv += [str(channel_dir(lab, node)), sif, str(minor), CONTAINER_VIEW]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env={"PATH": SYS_PATH})
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    finally:
        decoy.unlink(missing_ok=True)
        release(lab, job)
        wait_done(lab, job)
    views = _parse_view(done.stdout)
    mine, other = f"channel{minor}", "channel7"
    job_node = ("crw-------", UID, 234, minor)
    # the default (mount dev = yes): the host's directory, every node with its host owner and mode
    assert views["default"]["entries"] == {mine: job_node, other: ("crw-------", 65534, 234, 7)}, views["default"]
    # No such device or address: open(2) got past the permission check (the lab's major has no driver)
    assert views["default"]["open"] == {mine: "No such device or address", other: "Permission denied"}, views
    assert views["contain"]["entries"] == {} and views["contain"]["open"][mine] == "No such file or directory"
    assert views["contain-bind"]["entries"] == {mine: job_node}, views["contain-bind"]
    assert views["contain-bind"]["open"] == {mine: "No such device or address", other: "No such file or directory"}
    # the same bind without --contain is remounted nodev: the node is there and cannot be opened
    assert views["bind"]["open"][mine] == "Permission denied", views["bind"]
    assert leftovers(lab, node) == [], f"{node} not clean"
