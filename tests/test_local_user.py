"""What a local user's processes and files can do to the real hooks (issue 33 §1), with the attacker as ``imexlab``.

Every test runs real prolog and epilog processes (the simulator's rack, or the
hooks' fast path from a config under ``tmp_path``) beside processes or files
that the unprivileged user made.  Costs are asserted as what the hook read
(``rchar``), never as time: the timings are bench/run's (``attack`` section).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.commands.demo import SimRack
from imexctl.config.settings import Settings
from imexctl.platform import procscan
from tests.support.fakes import job_env
from tests.support.localuser import (
    as_user,
    fat_processes,
    needs_local_user,
    read_counted,
    shared_dir,
    spawn_as_user,
)
from tests.support.racks import sim_racks

pytestmark = needs_local_user

REPO = Path(__file__).resolve().parent.parent
#: the console script's start: an isolated interpreter, the checkout first on the path, then main()
MAIN = f"import sys; sys.path.insert(0, {str(REPO)!r}); from imexctl.cli import console; console()"
#: the attacker's processes: each with about 1 MB of command line (a quarter of the default stack limit at most)
FAT_BYTES = 1 << 20
FAT_COUNT = 12


@pytest.fixture
def make_rack() -> Iterator[Any]:
    """Simulated racks that clean up after themselves."""
    with sim_racks(SimRack, "imxu") as make:
        yield make


def _log(tray: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tray.root / "var/log/imexctl.log").read_text().splitlines()]


# ---------------------------------------------------------------- memory and time amplification


def test_an_idle_epilog_reads_a_bounded_part_of_a_users_command_lines(make_settings: Callable[..., Settings]) -> None:
    """Beside a local user's processes with 1 MB command lines, an idle epilog reads no more than beside none.

    Issue 33: every scan of ``/proc`` read each process's whole command line
    and kept them all at once, so an unrelated job's epilog grew with the
    user's forks (1.1 GiB and 2.2 s for 201 forks of 6 MB).  The fast path
    asks only root's processes (an IMEX daemon is root's), with bounded
    reads: a user's processes cost it nothing, dumpable or not.
    """
    cfg = make_settings(policy={"fabric": "none"})
    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(cfg.source), "epilog"]
    env = job_env(job_id=78)
    before = min(read_counted(argv, env)[1] for _ in range(2))
    with (
        fat_processes(FAT_COUNT - 2, FAT_BYTES, marker="idle-epilog") as fat,
        fat_processes(2, FAT_BYTES, dumpable=False),
    ):
        runs = [read_counted(argv, env) for _ in range(2)]
        assert all(Path(f"/proc/{pid}").exists() for pid in fat)
    assert [rc for rc, _, _ in runs] == [0, 0], runs
    assert [r["event"] for r in map(json.loads, cfg.paths.log_file.read_text().splitlines())][-1] == "epilog.done"
    more = min(read for _, read, _ in runs) - before
    # the user's processes: nothing at all; other processes that came meanwhile: a bound each
    assert more < FAT_COUNT * procscan.CMDLINE_BYTES, f"read {more} bytes more beside {FAT_COUNT} fat processes"


# ---------------------------------------------------------------- a fake slurmstepd


def test_a_users_fake_slurmstepd_keeps_no_gone_job_alive(make_rack: Any) -> None:
    """A local user's symlink named slurmstepd, titled ``[4242.extern]``: the next prolog and cleanup clear job 4242.

    Issue 33: ``job_is_running`` took any process named ``slurmstepd*``
    whose arguments held ``[<id>.``: the next job's prolog refused the tray
    with ``domain_busy`` (a drain) and ``cleanup`` skipped the job.
    """
    rack = make_rack(1)
    t = rack.trays[0]

    def leave(job: int) -> None:
        """The job's daemon dies and its epilog never comes: leftovers of a job that no longer runs here."""
        assert [r.returncode for r in rack.run_hooks("prolog", job)] == [0]
        os.kill(int((t.root / f"run/imexctl/jobs/{job}/daemon.pid").read_text().split()[0]), signal.SIGKILL)

    leave(4242)
    with shared_dir() as public:
        link = public / "slurmstepd"
        link.symlink_to("/bin/sh")
        fakes = [spawn_as_user([str(link), "-c", "sleep 600; :", f"[{job}.extern]"]) for job in (4242, 4252)]
        try:
            for p, job in zip(fakes, (4242, 4252)):
                _wait_for(
                    lambda p=p, job=job: f"[{job}.extern]".encode() in Path(f"/proc/{p.pid}/cmdline").read_bytes()
                )
            (result,) = rack.run_hooks("prolog", 4243)
            assert result.returncode == 0, result.output
            removed = [r for r in _log(t) if r["event"] == "state.removed" and r.get("job_id") == 4243]
            assert removed and "leftovers of job 4242" in removed[0]["reason"], removed
            assert [r.returncode for r in rack.run_hooks("epilog", 4243)] == [0]
            leave(4252)
            done = rack.imexctl(t, "cleanup")
            assert done.returncode == 0 and "job 4252" in done.stdout and "skipped" not in done.stdout, done.stdout
        finally:
            for p in fakes:
                p.kill()
                p.wait()
    assert rack.leftovers() == []


# ---------------------------------------------------------------- a job's port


def test_a_users_listener_on_the_jobs_port_is_named_not_blamed_on_a_daemon(make_rack: Any) -> None:
    """The local user listens on job 4271's SERVER_PORT on the tray's address: the real prolog names them.

    Issue 41: the prolog failed ``domain_busy`` with "is in use (a stale IMEX
    daemon?)" for any holder; a user who held the ranges drained every tray
    they could reach, and the reason blamed a daemon that was not there.  Now
    the holder is read from /proc/net/tcp and the processes' descriptors:
    ``port_held`` (69) naming uid 1501, the pid and the command, with the port
    guard as the fix.  Nothing of the job is left, and the tray works again
    once the user's process has ended.
    """
    import subprocess

    from imexctl.imex.config import job_port

    rack = make_rack(1)
    t, job = rack.trays[0], 4271
    port = job_port(job, (61000, 61999))
    code = "import socket, sys, time\ns = socket.socket()\ns.bind((sys.argv[1], int(sys.argv[2])))\ns.listen()\n"
    code += "print('listening', flush=True)\ntime.sleep(600)\n"
    user = spawn_as_user(["/usr/bin/python3", "-c", code, t.address, str(port)], stdout=subprocess.PIPE)
    try:
        assert user.stdout is not None and user.stdout.readline() == b"listening\n"
        (result,) = rack.run_hooks("prolog", job)
        assert result.returncode == 69, result.output
        (done,) = [r for r in _log(t) if r["event"] == "prolog.done" and r.get("job_id") == job]
        why = done["reason"]
        assert done["error_code"] == "port_held", done
        assert why.startswith(
            f"SERVER_PORT {t.address}:{port} is held by pid {user.pid} (uid 1501 imexlab: /usr/bin/python3 -c import"
        ), why
        assert "not an IMEX daemon: a local user's" in why and "port guard" in why and "stale" not in why, why
        assert rack.leftovers() == []
    finally:
        user.kill()
        user.wait()
    assert [r.returncode for r in rack.run_hooks("prolog", job)] == [0]
    assert [r.returncode for r in rack.run_hooks("epilog", job)] == [0]
    assert rack.leftovers() == []


# ---------------------------------------------------------------- files in directories others can write


@pytest.fixture
def tray() -> Iterator[Path]:
    """A tray's root (0755) with an imexctl.conf whose log and metrics directories the tests make."""

    with shared_dir() as base:
        _config(base)
        yield base


#: the tray's policy: jobs outside partition gpu are skipped (the prolog's fast path, as for most jobs of a cluster)
POLICY = {"fabric": "none", "jobs": "partitions", "partitions": "gpu"}


def _config(base: Path, **sections: dict[str, str]) -> Path:
    from tests.conftest import write_config

    return write_config(base, {"paths": {"root": str(base)}, "policy": POLICY, **sections})


def _dir_of_the_users_group(path: Path) -> Path:
    """``path`` made root's with mode 0775 and the local user's group: the user may write it (Ubuntu's /var/log)."""
    from tests.support.localuser import user_ids

    ids = user_ids()
    assert ids is not None
    path.mkdir(parents=True)
    os.chown(path, 0, ids[1])
    path.chmod(0o775)
    return path


def _hook(base: Path, hook: str, job: int = 78, timeout: float = 60) -> tuple[int, str]:
    """Run a real hook (``prolog`` or ``epilog``) for ``job`` with the tray's config: exit code and stderr."""
    import subprocess

    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(base / "imexctl.conf"), hook]
    env = job_env(job_id=job, SLURM_JOB_PARTITION="cpu")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return done.returncode, done.stderr


@pytest.mark.parametrize("where", ["group", "others"])
def test_a_fifo_at_the_log_name_blocks_no_hook(tray: Path, where: str) -> None:
    """The local user's FIFO at ``[paths] log_file`` (in a directory they may write): the hook runs on, unlogged.

    Issue 33: the log was opened without ``O_NONBLOCK`` or a type check, so
    the open waited for a reader: every hook blocked until slurmd killed it
    and drained the tray.  Now a directory others may write is refused
    outright, and in one the group may write (Ubuntu's ``/var/log``) only a
    regular file of root's is opened, never waited for.
    """
    logs = tray / "var/log"
    if where == "group":
        _dir_of_the_users_group(logs)
    else:
        logs.mkdir(parents=True)
        logs.chmod(0o1777)
    fifo = logs / "imexctl.log"
    assert as_user(["/usr/bin/mkfifo", "-m", "0666", str(fifo)]).returncode == 0
    for hook in ("epilog", "prolog"):
        rc, err = _hook(tray, hook)
        assert rc == 0, err
        why = (
            "is a FIFO (not a regular file)" if where == "group" else "must be owned by root and not writable by others"
        )
        assert f"cannot open log file {fifo}: " in err and why in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.lstat(fifo).st_uid != 0  # left as the user made it


def test_a_users_file_at_the_log_name_is_not_written(tray: Path) -> None:
    """The local user's own regular file at the log's name, in a directory of their group: refused, not appended to."""
    logs = _dir_of_the_users_group(tray / "var/log")
    mine = logs / "imexctl.log"
    assert as_user(["/usr/bin/touch", str(mine)]).returncode == 0
    rc, err = _hook(tray, "epilog")
    assert rc == 0 and "must be a regular file of root's that others may not write" in err, err
    assert mine.read_text() == ""


def test_a_huge_sparse_metrics_file_is_not_read(tray: Path) -> None:
    """The local user's 1 GiB sparse ``imexctl.prom`` in ``textfile_dir`` (their group may write it): read not at all.

    Issue 33: the metrics write read the old file whole to compare it (2 GiB
    and 7 s per hook).  Now a file of another size is replaced unread.
    """
    metrics = _dir_of_the_users_group(tray / "metrics")
    _config(tray, metrics={"textfile_dir": "/metrics"})
    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(tray / "imexctl.conf"), "epilog"]
    before = min(read_counted(argv, job_env(job_id=78))[1] for _ in range(2))
    prom = metrics / "imexctl.prom"
    prom.unlink()
    assert as_user(["/usr/bin/truncate", "-s", "1G", str(prom)]).returncode == 0
    rc, read, out = read_counted(argv, job_env(job_id=78))
    assert rc == 0, out
    assert read - before < 1 << 20, f"the epilog read {read - before} bytes more beside a 1 GiB imexctl.prom"
    assert os.stat(prom).st_uid == 0 and "imexctl_hook_runs_total" in prom.read_text()


def test_metrics_in_a_directory_others_may_write_are_refused(tray: Path) -> None:
    """``textfile_dir`` writable by others: the hook warns (``metrics.failed``), writes nothing there, and succeeds."""
    metrics = tray / "metrics"
    metrics.mkdir()
    metrics.chmod(0o1777)
    _config(tray, metrics={"textfile_dir": "/metrics"})
    rc, err = _hook(tray, "epilog")
    assert rc == 0, err
    failed = [json.loads(line) for line in (tray / "var/log/imexctl.log").read_text().splitlines()]
    assert [r["event"] for r in failed][-2:] == ["epilog.done", "metrics.failed"], failed
    assert "textfile_dir" in failed[-1]["reason"] and "not writable by others" in failed[-1]["reason"]
    assert list(metrics.iterdir()) == []


def _as_user_write(path: Path, text: str) -> None:
    """The local user writes ``text`` into a new file of theirs at ``path`` (gzip for ``.gz``), mode 0644."""
    code = (
        "import gzip, sys\n"
        "opener = gzip.open if sys.argv[1].endswith('.gz') else open\n"
        "with opener(sys.argv[1], 'wt') as f:\n"
        "    f.write(sys.argv[2])\n"
    )
    done = as_user([sys.executable, "-I", "-c", code, str(path), text])
    assert done.returncode == 0, done.stdout


def test_why_tells_no_story_from_a_users_file_at_the_logs_name(tray: Path) -> None:
    """The local user renames a file of theirs over ``imexctl.log`` and plants a rotated copy: ``why`` leaves both out.

    Issue 41: the log's directory is one their group may write (Ubuntu's
    ``/var/log``); the hooks then refuse the log and write only to stderr, and
    ``imexctl why`` told the user's forged story (the job failed, another
    tray to blame) as root's record.  Now only root's files are told, and the
    two are named as left out.
    """
    logs = _dir_of_the_users_group(tray / "var/log")
    assert _hook(tray, "prolog")[0] == 0  # root's record: job 78 skipped (partition cpu)
    os.rename(logs / "imexctl.log", logs / "imexctl.log.1")  # logrotate, as root
    forged = json.dumps(
        {"event": "prolog.done", "job_id": 78, "hook": "prolog", "node": "gb01", "timestamp": "2099-01-01T00:00:00Z",
         "ok": False, "error_code": "not_ready", "exit_code": 75, "reason": "FORGED: tray gb02 blocked"}
    ) + "\n"  # fmt: skip
    _as_user_write(logs / ".mine", forged)
    assert as_user(["/bin/mv", str(logs / ".mine"), str(logs / "imexctl.log")]).returncode == 0
    _as_user_write(logs / "imexctl.log.2.gz", forged)
    rc, err = _hook(tray, "epilog")  # the hooks refuse the user's file: stderr only
    assert rc == 0 and f"cannot open log file {logs / 'imexctl.log'}: " in err, err
    import subprocess

    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(tray / "imexctl.conf"), "why", "78"]
    done = subprocess.run(argv, env={"SLURMD_NODENAME": "gb01"}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("job 78 on gb01: skipped\n"), done.stdout
    assert "FORGED" not in done.stdout and "not_ready" not in done.stdout
    uid = os.stat(logs / "imexctl.log").st_uid
    for name in ("imexctl.log", "imexctl.log.2.gz"):
        assert f"skipped {logs / name}: not root's record (owner uid {uid}, mode 0644), left out" in done.stdout
    assert f"read: {logs / 'imexctl.log.1'} (" in done.stdout


# ---------------------------------------------------------------- the kernel's log


def test_a_users_mount_option_in_the_kernel_log_drains_nothing(tmp_path: Path) -> None:
    """The local user's ``unshare -rm`` and ``mount -t tmpfs -o '<the driver's words>'``: the kernel logs the
    option on the machine's real ``/dev/kmsg``, and the real ``imexctl health --check-only`` stays healthy.

    Issue 41: health counted any record holding "Abrupt nvidia-imex daemon
    shutdown detected": the kernel's ``tmpfs: Unknown parameter '...'`` made
    it ``imex_shutdown``, a drain only an admin resumes, as often as the user
    liked.  Now only the driver's own record counts (imex/driverlog.py).
    """
    import subprocess

    from imexctl.imex import driverlog
    from imexctl.platform import kmsg
    from tests.conftest import write_config
    from tests.support.ci import unavailable
    from tests.support.localuser import USER

    said = "Abrupt nvidia-imex daemon shutdown detected"  # what health matched; a mount option ends at a comma
    forged = f"NVRM: {driverlog.FUNCTION}: {said}"
    if as_user(["/usr/bin/unshare", "-rm", "/bin/true"]).returncode != 0:
        unavailable(f"this machine does not let {USER} make a user namespace (unshare -rm)")
    _, before = kmsg.read_after("/dev/kmsg", -1)
    done = as_user(["/usr/bin/unshare", "-rm", "/usr/bin/mount", "-t", "tmpfs", "-o", forged, "none", "/tmp"])
    assert done.returncode != 0, done.stdout  # no mount: the kernel refused the option, and logged it
    echoed = [r for r in kmsg.read_after("/dev/kmsg", before)[0] if forged in r.message]
    if not echoed:
        unavailable("this kernel does not log an unknown tmpfs option")
    assert echoed[0].facility == kmsg.KERNEL and said in echoed[0].message  # the old check's match, as the kernel's
    paths = {"root": "/", "run_dir": str(tmp_path / "run"), "log_file": str(tmp_path / "imexctl.log")}
    config = write_config(tmp_path, {"paths": paths, "daemon": {"backend": "exec"}, "policy": {"fabric": "none"}})
    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(config), "health", "--check-only", "--node", "gb01"]
    health = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert health.returncode == 0 and health.stdout.startswith("healthy gb01: "), health.stdout + health.stderr
    seen = (tmp_path / "run/health.kmsg").read_text().split()
    assert int(seen[1]) >= echoed[0].seq and len(seen) == 2  # read past the forged record; nothing pending


# ---------------------------------------------------------------- slurmd's umask


@pytest.fixture
def user_rack() -> Iterator[SimRack]:
    """One simulated tray whose jobs belong to the local user, under a directory that user may traverse."""
    import random
    import shutil
    import tempfile

    from tests.support.localuser import user_ids

    ids = user_ids()
    assert ids is not None
    base = Path(tempfile.mkdtemp(prefix="imxu", dir="/tmp"))
    base.chmod(0o755)
    rack = SimRack(base, 1, deadline_s=20, uid=ids[0], first_address=random.randrange(20, 249))
    try:
        yield rack
    finally:
        rack.kill_all()
        shutil.rmtree(base, ignore_errors=True)


def _task_prolog(rack: SimRack, job: int, **env: str) -> str:
    """What ``imexctl task-prolog`` prints for the job's task, run as the job's (local) user."""
    t = rack.trays[0]
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from imexctl.channels.taskprolog import main; main()"
    done = as_user(
        [sys.executable, "-I", "-c", code],
        env={"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": t.name, "IMEXCTL_CONFIG": str(t.config), **env},
    )
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_under_slurmds_strict_umask_the_task_prolog_exports_the_channel(user_rack: SimRack) -> None:
    """A real prolog under umask 027 (slurmd's at some sites): the job's user's TaskProlog exports the channel.

    Issue 33: the run directories came out 0750 and the TaskProlog exported
    nothing; the channel directory too, so the channel could not be opened.
    """
    rack, t = user_rack, user_rack.trays[0]
    old = os.umask(0o027)
    try:
        (result,) = rack.run_hooks("prolog", 4260)
    finally:
        os.umask(old)
    assert result.returncode == 0, result.output
    minor = json.loads((t.root / "run/imexctl/jobs/4260/state.json").read_text())["channel_minor"]
    assert minor is not None
    assert _task_prolog(rack, 4260) == f"export NVIDIA_IMEX_CHANNELS={minor}\n"
    for d in ("run", "run/imexctl", "run/imexctl/jobs", "run/imexctl/jobs/4260", "dev/nvidia-caps-imex-channels"):
        assert (t.root / d).stat().st_mode & 0o777 == 0o755, d
    assert [r.returncode for r in rack.run_hooks("epilog", 4260)] == [0]
    assert rack.leftovers() == []


def _wait_for(probe: Callable[[], bool], timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline
        time.sleep(0.01)
