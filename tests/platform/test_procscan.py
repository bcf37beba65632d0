"""The /proc scan against a local user's processes: bounded reads, other users' processes skipped (issue 33)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl.platform import procscan
from imexctl.platform.host import RealHost
from tests.support.localuser import fat_processes, needs_local_user, shared_dir, spawn_as_user, user_ids

#: the attacker's command lines: 8 elements of 128 KiB, about 1 MB (the kernel's limit is a quarter of the stack's)
FAT = 1 << 20


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[int]]:
    """Record, per pid, the bytes asked of each read of its command line and the bytes that came back."""
    asked: dict[int, list[int]] = {}
    real = procscan.read_cmdline

    def read(pid: int, max_bytes: int = procscan.CMDLINE_BYTES) -> bytes:
        data = real(pid, max_bytes)
        asked.setdefault(pid, []).extend([max_bytes, len(data)])
        return data

    monkeypatch.setattr(procscan, "read_cmdline", read)
    return asked


@needs_local_user
def test_scan_reads_at_most_a_bound_of_any_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local user's 1 MB command lines: one read of at most CMDLINE_BYTES each, never the whole."""
    with fat_processes(3, FAT, marker="scan-bound") as pids:
        asked = _counting_reads(monkeypatch)
        seen = dict(procscan.scan())
    for pid in pids:
        assert len(seen[pid]) == procscan.CMDLINE_BYTES, pid
        assert asked[pid] == [procscan.CMDLINE_BYTES, procscan.CMDLINE_BYTES], asked[pid]
    assert all(size <= procscan.CMDLINE_BYTES for sizes in asked.values() for size in sizes)


@needs_local_user
def test_scan_of_roots_processes_reads_nothing_of_another_users() -> None:
    """With uids={0}, a local user's processes are left out without a read, a non-dumpable one too.

    A process that is not dumpable has its files in ``/proc/<pid>`` owned by
    root; the directory itself keeps the effective uid, which the scan judges.
    """
    with fat_processes(2, FAT, marker="scan-uid") as plain, fat_processes(1, FAT, dumpable=False) as hidden:
        rchar = _rchar()
        seen = dict(procscan.scan(uids={0}))
        read = _rchar() - rchar
        assert not (set(plain) | set(hidden)) & set(seen)
        assert os.stat(f"/proc/{hidden[0]}/cmdline").st_uid == 0  # it is not dumpable
        assert os.getpid() in seen
    # every root's process costs at most a bound; none of the user's megabytes are read
    assert read <= len(seen) * procscan.CMDLINE_BYTES + (1 << 16), (read, len(seen))


@needs_local_user
def test_mentioned_in_proc_finds_root_and_not_a_users_process(tmp_path: Path) -> None:
    """The fast path's question: root's process naming the config counts, a local user's naming it does not."""
    config = str(tmp_path / "jobs/7/config.cfg")
    code = "import time; time.sleep(600)"
    user = spawn_as_user([sys.executable, "-I", "-c", code, "-c", config])
    try:
        _wait_for_cmdline(user.pid, config)
        assert procscan.mentioned_in_proc(config)
        assert not procscan.mentioned_in_proc(config, uids={0})
        assert RealHost().processes_with_arg(config, uids={0}) == []
        assert [p.pid for p in RealHost().processes_with_arg(config)] == [user.pid]
    finally:
        user.kill()
        user.wait()


def _wait_for_cmdline(pid: int, text: str) -> None:
    deadline = time.monotonic() + 30
    while text.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, pid
        time.sleep(0.01)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_cut_off_command_line_loses_only_its_last_element(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a bounded read returns splits at NULs; the element cut in the middle is left out, not split at blanks."""
    from imexctl.platform import host

    raw = b"/usr/bin/prog\0-c\0/run/x y/config.cfg\0" + b"z" * procscan.CMDLINE_BYTES
    cut = raw[: procscan.CMDLINE_BYTES]
    assert host._split_raw(cut) == ("/usr/bin/prog", "-c", "/run/x y/config.cfg")
    assert host._split_raw(b"a b\0c\0") == ("a b", "c")


# ---------------------------------------------------------------- RealHost.job_is_running


@pytest.fixture
def public() -> Iterator[Path]:
    """A directory every user may reach."""
    with shared_dir() as path:
        yield path


@pytest.fixture
def stepd_program(public: Path) -> Path:
    """A file named slurmstepd that runs like one: a copy of /bin/sh, where every user may run it."""
    import shutil

    prog = public / "slurmstepd"
    shutil.copy2("/bin/sh", prog)
    prog.chmod(0o755)
    return prog


def _stepd_like(argv0: str, job_id: int, *, user: bool) -> subprocess.Popen[bytes]:
    """A process titled like Slurm's step daemon for ``job_id`` (``sh -c`` keeps the title as its $0)."""
    argv = [argv0, "-c", "sleep 600; :", f"[{job_id}.extern]"]
    if user:
        return spawn_as_user(argv)
    return subprocess.Popen(argv, cwd="/", stdin=subprocess.DEVNULL)


@needs_local_user
def test_a_users_slurmstepd_keeps_no_job_running(public: Path, stepd_program: Path) -> None:
    """A local user's process named slurmstepd (a symlink, or a copy of the real program) titled [<id>.: no job.

    Issue 33: ``job_is_running`` accepted any process named ``slurmstepd*``
    whose arguments held ``[<id>.``, so a user kept a gone job alive (the
    next prolog refused the tray with ``domain_busy``).
    """
    link = public / "bin/slurmstepd"
    link.parent.mkdir(mode=0o755)
    link.symlink_to("/bin/sh")
    procs = [_stepd_like(str(link), 4242, user=True), _stepd_like(str(stepd_program), 4243, user=True)]
    try:
        for p, job in zip(procs, (4242, 4243)):
            _wait_for_cmdline(p.pid, f"[{job}.extern]")
        assert Path(f"/proc/{procs[0].pid}/comm").read_text().strip() == "slurmstepd"  # what psutil's name() says
        assert not RealHost().job_is_running(4242)
        assert not RealHost().job_is_running(4243)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a slurmstepd is a process of root's")
def test_roots_slurmstepd_keeps_its_job_running(stepd_program: Path) -> None:
    """Root's process whose executable is named slurmstepd, titled [<id>.: the job runs; another job does not."""
    p = _stepd_like(str(stepd_program), 4244, user=False)
    try:
        _wait_for_cmdline(p.pid, "[4244.extern]")
        assert RealHost().job_is_running(4244)
        assert not RealHost().job_is_running(424)
    finally:
        p.kill()
        p.wait()


@needs_local_user
def test_only_roots_cgroup_of_a_job_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``job_<id>`` cgroup directory counts only when root owns it: Slurm makes it as root, a user's is theirs."""
    from imexctl.platform import host

    uid, gid = user_ids() or (0, 0)
    v2 = tmp_path / "system.slice/slurmstepd.scope"
    v1 = tmp_path / "memory/slurm/uid_1501"
    for d in (v2, v1):
        d.mkdir(parents=True)
    (v2 / "job_11").mkdir()
    (v1 / "job_12").mkdir()
    for made in (v2 / "job_13", v1 / "job_14"):
        made.mkdir()
        os.chown(made, uid, gid)
    (v2 / "job_15").symlink_to(v2 / "job_11")
    monkeypatch.setattr(host, "_CGROUP", str(tmp_path))
    assert [j for j in range(11, 16) if RealHost().job_is_running(j)] == [11, 12]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a slurmstepd is a process of root's")
@pytest.mark.parametrize("name", ["slurmstepd-wlm", "slurmstepdx"])
def test_a_packagers_slurmstepd_name(public: Path, name: str) -> None:
    """Debian's executable is slurmstepd-wlm (behind the slurmstepd symlink): it counts; another name does not."""
    import shutil

    prog = public / name
    shutil.copy2("/bin/sh", prog)
    p = _stepd_like(str(prog), 4245, user=False)
    try:
        _wait_for_cmdline(p.pid, "[4245.extern]")
        assert RealHost().job_is_running(4245) == (name == "slurmstepd-wlm")
    finally:
        p.kill()
        p.wait()
