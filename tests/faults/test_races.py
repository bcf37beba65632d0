"""Hooks of different jobs overlapping on one tray, forced at step boundaries (docs/design.md, "Hooks that overlap").

The first hook pauses at a step boundary (tests/faults/driver.py ``pause``), the
second runs against it, then the first goes on.  Each case checks the outcome
that design.md's table documents, and that no hook ever stopped or changed a
domain that another job owns (its daemon pid, files and channel, captured
before and after).  Also here: the node lock (timeouts, a dead holder, hostile
lock files) and the policy paths that no other test runs end to end
(``[policy] shared``, ``channels = none``, the ``--constraint`` gate).
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from imexctl.commands.demo import HookResult, Tray
from tests.faults.rack import FaultRack, Run
from tests.simhelpers import wait_for

PROLOG_STEPS = ["start", "locked", "claimed", "files_written", "daemon_started", "ready", "channel_created"]
#: prolog steps at which the job directory exists (before them, an epilog finds nothing of the job)
WITH_FILES = PROLOG_STEPS[3:]
EPILOG_STEPS = ["start", "locked", "daemon_stopped", "channel_removed", "removed"]
#: without a topology source or SLURM_CONF (the simulated trays) the channel number is the job-id rule
#: 1 + job id % 2047 (design.md "The channel rule"): these two jobs share one, so a mix-up would show
JOB_A, JOB_B = 610, 610 + 2047
BUSY, LOCK_TIMEOUT, FILE_FAILED = 69, 75, 71

MakeRack = Callable[..., FaultRack]


# ---------------------------------------------------------------- helpers


def tray(make_rack: MakeRack, **sections: dict[str, str]) -> tuple[FaultRack, Tray]:
    """A one-tray rack (a one-tray domain: daemon, readiness, channel), its config changed by ``sections``."""
    rack = make_rack(1, deadline_s=6)
    t = rack.trays[0]
    conf = configparser.ConfigParser()
    conf.read(t.config)
    for section, keys in sections.items():
        if not conf.has_section(section):
            conf.add_section(section)
        for key, value in keys.items():
            conf.set(section, key, value)
    with t.config.open("w") as f:
        conf.write(f)
    return rack, t


def job_dir(t: Tray, job: int) -> Path:
    return t.root / f"run/imexctl/jobs/{job}"


def domain(t: Tray, job: int) -> dict[str, Any]:
    """Everything of job ``job`` on the tray: daemon processes, files (inode, mtime, content), its channel."""
    jd = job_dir(t, job)
    files = {}
    if jd.exists():
        for p in sorted(jd.iterdir()):
            try:
                st, data = p.lstat(), p.read_bytes()
            except FileNotFoundError:  # removed meanwhile by a hook that is still running
                continue
            files[p.name] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(data).hexdigest())
    config = str(jd / "config.cfg")
    pids = sorted(
        (p.pid, p.info["create_time"])
        for p in psutil.process_iter(["cmdline", "create_time", "status"])
        if config in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    )
    chan = t.root / f"dev/nvidia-caps-imex-channels/channel{1 + job % 2047}"
    st = chan.lstat() if chan.exists() else None
    channel = (st.st_ino, st.st_rdev, st.st_uid, stat.S_IMODE(st.st_mode)) if st else None
    return {"files": files, "daemon": pids, "channel": channel}


def up(rack: FaultRack, t: Tray, job: int) -> dict[str, Any]:
    """Run job ``job``'s prolog to success; its complete domain."""
    res, _ = rack.run(t, "prolog", job)
    assert res.returncode == 0, res.output
    dom = domain(t, job)
    assert dom["daemon"] and dom["channel"] and "state.json" in dom["files"], dom
    return dom


def paused(rack: FaultRack, t: Tray, hook: str, job: int, step: str, **kw: Any) -> Run:
    """Start ``hook`` and wait until it pauses at ``step``."""
    run = rack.start(t, hook, job, f"{step}=pause", **kw)
    assert run.reached(step), run.result().output
    return run


def at_lock(run: Run) -> bool:
    """Whether the run holds its tray's node lock file open (the hooks open it only to take the lock)."""
    lock = os.path.realpath(run.tray.root / "run/imexctl/lock")
    fds = Path(f"/proc/{run.proc.pid}/fd")
    for fd in fds.iterdir() if fds.is_dir() else ():
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd) == lock:
                return True
    return False


def waits(run: Run) -> None:
    """The run got going and stopped at the node lock, which another hook holds: it waits for it.

    Waited for, never slept for: the run is at the lock once it has the lock file open, however loaded the
    machine, and it cannot have passed it while the other hook holds it (its steps stay ``start``).
    """

    def waiting() -> bool:
        assert run.proc.poll() is None, run.result().output  # ended instead of waiting
        return at_lock(run)

    wait_for(waiting, 60, 0.01, what=f"{run.dir.name} to wait at the node lock")
    assert run.proc.poll() is None and run.steps() == ["start"], run.steps()


def finish(run: Run, step: str) -> HookResult:
    run.release(step)
    return run.result()


def last(t: Tray, event: str, job: int | None = None) -> dict[str, Any]:
    """The tray log's last ``event`` line (of job ``job``)."""
    for line in reversed((t.root / "var/log/imexctl.log").read_text().splitlines()):
        rec = json.loads(line)
        if rec["event"] == event and (job is None or rec.get("job_id") == job):
            return dict(rec)
    raise AssertionError(f"no {event} line of job {job}")


def busy_with(t: Tray, job: int, other: int) -> None:
    """Job ``job``'s prolog was refused because job ``other`` owns the domain, and left nothing."""
    rec = last(t, "prolog.done", job)
    assert rec["error_code"] == "domain_busy" and f"belongs to job {other}" in rec["reason"], rec
    left = domain(t, job)
    assert left["files"] == {} and left["daemon"] == [], left


def epilog_clean(rack: FaultRack, t: Tray, *jobs: int) -> None:
    for job in jobs:
        res, _ = rack.run(t, "epilog", job)
        assert res.returncode == 0, res.output
    assert rack.dirty() == []


# ---------------------------------------------------------------- (a) a late epilog, the next job's prolog


@pytest.mark.parametrize("step", PROLOG_STEPS)
def test_epilog_of_a_job_with_nothing_here_never_waits_nor_touches(make_rack: MakeRack, step: str) -> None:
    """B's prolog is paused at ``step``; A's late epilog (A left nothing, same channel minor) exits 0 at once."""
    rack, t = tray(make_rack)
    b = paused(rack, t, "prolog", JOB_B, step)
    before = domain(t, JOB_B)
    res, run = rack.run(t, "epilog", JOB_A)
    assert res.returncode == 0 and run.steps() == ["start"], res.output  # no node lock taken
    assert domain(t, JOB_B) == before
    assert finish(b, step).returncode == 0
    assert domain(t, JOB_B)["daemon"] and domain(t, JOB_B)["channel"]
    epilog_clean(rack, t, JOB_B)


@pytest.mark.parametrize(
    ("first", "step"), [("epilog", s) for s in EPILOG_STEPS] + [("prolog", s) for s in ("start", "locked")]
)
def test_late_epilog_and_next_prolog(make_rack: MakeRack, first: str, step: str) -> None:
    """Job A's domain is up; A's epilog and B's prolog overlap, either one paused at ``step``."""
    rack, t = tray(make_rack)
    a_dom = up(rack, t, JOB_A)
    job = JOB_A if first == "epilog" else JOB_B
    one = paused(rack, t, first, job, step)
    two = rack.start(t, "prolog" if first == "epilog" else "epilog", JOB_B if first == "epilog" else JOB_A)
    if (first, step) in (("epilog", "start"), ("prolog", "start")):
        res2 = two.result()  # nobody holds the lock: the second hook runs through
        assert domain(t, JOB_A) == (a_dom if first == "epilog" else {"files": {}, "daemon": [], "channel": None})
    else:
        waits(two)
        res2 = None
    res1 = finish(one, step)
    res2 = res2 or two.result()
    prolog_res = res2 if first == "epilog" else res1
    epilog_res = res1 if first == "epilog" else res2
    assert epilog_res.returncode == 0, epilog_res.output
    if (first, step) == ("epilog", "start"):
        assert prolog_res.returncode == BUSY, prolog_res.output  # A's domain was still there, A still running
        busy_with(t, JOB_B, JOB_A)
        assert rack.dirty() == []
    elif (first, step) == ("prolog", "locked"):
        # A's epilog marked A's domain ended before it waited for the lock: B's prolog clears it (issue 22)
        assert prolog_res.returncode == 0, prolog_res.output
        assert f"leftovers of job {JOB_A}" in last(t, "state.removed", JOB_B)["reason"]
        a_left = domain(t, JOB_A)
        assert (a_left["files"], a_left["daemon"]) == ({}, []), a_left  # the channel node is B's now (same minor)
        epilog_clean(rack, t, JOB_B)
    else:
        assert prolog_res.returncode == 0, prolog_res.output  # A's epilog finished first
        epilog_clean(rack, t, JOB_B)


# ---------------------------------------------------------------- (b) two prologs at once


@pytest.mark.parametrize("step", PROLOG_STEPS)
def test_two_prologs_of_different_jobs(make_rack: MakeRack, step: str) -> None:
    """A's prolog is paused at ``step`` and B's starts: the one that claims first wins, the other gets 69."""
    rack, t = tray(make_rack)
    a = paused(rack, t, "prolog", JOB_A, step)
    if step == "start":
        assert rack.run(t, "prolog", JOB_B)[0].returncode == 0  # B got the lock and the node first
        b_dom = domain(t, JOB_B)
        assert finish(a, step).returncode == BUSY
        busy_with(t, JOB_A, JOB_B)
        assert domain(t, JOB_B) == b_dom
        epilog_clean(rack, t, JOB_B)
        return
    b = rack.start(t, "prolog", JOB_B, "locked=pause")  # B holds the lock, before its claim: A is done then
    waits(b)
    assert finish(a, step).returncode == 0
    assert b.reached("locked")
    a_dom = domain(t, JOB_A)
    assert finish(b, "locked").returncode == BUSY
    busy_with(t, JOB_B, JOB_A)
    assert domain(t, JOB_A) == a_dom
    epilog_clean(rack, t, JOB_A)


@pytest.mark.parametrize("step", ["start", "files_written", "channel_created"])
def test_the_same_jobs_prolog_twice(make_rack: MakeRack, step: str) -> None:
    """A second prolog of the same job (slurmd restarted during the first): the later one finds the earlier one's
    finished domain of the same run and keeps it untouched (issue 32); both exit 0, one daemon, started once."""
    rack, t = tray(make_rack)
    first = paused(rack, t, "prolog", JOB_A, step)
    second = rack.start(t, "prolog", JOB_A)
    if step == "start":
        assert second.result().returncode == 0  # it got the lock first and set the domain up
        built = domain(t, JOB_A)
        assert finish(first, step).returncode == 0
    else:
        waits(second)
        assert finish(first, step).returncode == 0
        built = domain(t, JOB_A)
        assert second.result().returncode == 0
    dom = domain(t, JOB_A)
    # the files and the channel as the first set-up left them (a probe of the kept domain may have been running
    # when built was taken: its ctl names the config too, so the daemon is judged by the log below)
    assert (dom["files"], dom["channel"]) == (built["files"], built["channel"]) and dom["channel"], (built, dom)
    assert len(dom["daemon"]) == 1, dom
    lines = [json.loads(ln) for ln in (t.root / "var/log/imexctl.log").read_text().splitlines()]
    mine = [r["event"] for r in lines if r.get("job_id") == JOB_A]
    assert [e for e in mine if e.startswith("imex.daemon.")] == ["imex.daemon.started"], mine
    assert mine.count("imex.domain.kept") == 1 and "state.removed" not in mine, mine
    epilog_clean(rack, t, JOB_A)


# ---------------------------------------------------------------- (c) a job's epilog during its own prolog


@pytest.mark.parametrize("step", PROLOG_STEPS)
def test_epilog_during_its_own_prolog(make_rack: MakeRack, step: str) -> None:
    """slurmd never does this (it waits for the prolog); forced, the epilog waits once the job has files."""
    rack, t = tray(make_rack)
    pro = paused(rack, t, "prolog", JOB_A, step)
    epi = rack.start(t, "epilog", JOB_A)
    if step in WITH_FILES:
        waits(epi)
        assert finish(pro, step).returncode == 0
        assert epi.result().returncode == 0
        assert rack.dirty() == []
        return
    # no file of the job yet: the epilog finds nothing, and the prolog then builds a domain that outlives it
    res = epi.result()
    assert res.returncode == 0 and epi.steps() == ["start"], res.output
    assert finish(pro, step).returncode == 0
    assert domain(t, JOB_A)["daemon"]
    kept = rack.imexctl(t, "cleanup")
    assert kept.returncode == 0 and f"skipped: job {JOB_A} may still run" in kept.stdout
    forced = rack.imexctl(t, "cleanup", "--job", str(JOB_A), "--force")
    assert forced.returncode == 0 and rack.dirty() == [], forced.stdout + forced.stderr


# ---------------------------------------------------------------- (d) cleanup and a prolog


@pytest.mark.parametrize("step", PROLOG_STEPS)
def test_cleanup_during_a_prolog_leaves_the_new_domain(make_rack: MakeRack, step: str) -> None:
    """``imexctl cleanup`` while A's prolog is paused at ``step``: it waits, then leaves A's fresh domain alone."""
    rack, t = tray(make_rack)
    pro = paused(rack, t, "prolog", JOB_A, step)
    if step == "start":
        assert rack.imexctl(t, "cleanup").returncode == 0  # nothing of A yet, and A waits for nobody
        assert finish(pro, step).returncode == 0
    else:
        seen = domain(t, JOB_A)
        clean = rack.start(t, "cleanup", 0, "locked=pause")  # it holds the lock, A is done: look, then go on
        waits(clean)
        assert finish(pro, step).returncode == 0
        assert clean.reached("locked")
        done = domain(t, JOB_A)
        assert not seen["daemon"] or done["daemon"] == seen["daemon"]
        res = finish(clean, "locked")
        assert res.returncode == 0 and f"skipped: job {JOB_A} may still run on this node" in res.output, res.output
        assert domain(t, JOB_A) == done
    dom = domain(t, JOB_A)
    assert dom["daemon"] and dom["channel"]
    assert last(t, "cleanup.done")["actions"] == []
    epilog_clean(rack, t, JOB_A)


def test_forced_cleanup_during_a_prolog_removes_it_after(make_rack: MakeRack) -> None:
    """``cleanup --force`` is the admin's word: it waits for the prolog, then tears the job down."""
    rack, t = tray(make_rack)
    pro = paused(rack, t, "prolog", JOB_A, "ready")
    clean = rack.start(t, "cleanup", 0, args=("--force",))
    waits(clean)
    assert finish(pro, "ready").returncode == 0
    assert clean.result().returncode == 0
    assert rack.dirty() == []


@pytest.mark.parametrize("step", ["locked", "daemon_stopped", "removed"])
def test_prolog_during_cleanup_of_a_dead_job(make_rack: MakeRack, step: str) -> None:
    """Cleanup, paused at ``step`` while it removes a killed prolog's leftovers: B's prolog waits, then succeeds."""
    rack, t = tray(make_rack)
    dead, _ = rack.run(t, "prolog", JOB_A, "ready=kill")
    assert dead.returncode == -9 and domain(t, JOB_A)["daemon"]
    clean = paused(rack, t, "cleanup", 0, step)
    b = rack.start(t, "prolog", JOB_B)
    waits(b)
    res = finish(clean, step)
    assert res.returncode == 0 and f"job {JOB_A}" in res.output, res.output
    assert b.result().returncode == 0
    assert domain(t, JOB_A) == {"files": {}, "daemon": [], "channel": domain(t, JOB_B)["channel"]}
    epilog_clean(rack, t, JOB_B)


# ---------------------------------------------------------------- the node lock


@pytest.mark.parametrize("hook", ["prolog", "epilog", "cleanup"])
def test_lock_held_too_long_is_a_timeout_that_leaves_nothing(make_rack: MakeRack, hook: str) -> None:
    """A's prolog holds the lock (paused at files_written) past ``lock_timeout_s``: the other hook exits 75."""
    rack, t = tray(make_rack, daemon={"lock_timeout_s": "1"})
    pro = paused(rack, t, "prolog", JOB_A, "files_written")
    seen = domain(t, JOB_A)
    res, _ = rack.run(t, hook, {"prolog": JOB_B, "epilog": JOB_A, "cleanup": 0}[hook])
    assert res.returncode == LOCK_TIMEOUT and "for more than 1s" in res.output, res.output
    now = domain(t, JOB_A)
    assert domain(t, JOB_B)["files"] == {} and now["daemon"] == seen["daemon"]
    assert now == seen or hook == "epilog"  # A's own epilog marked A's state.json ended, and changed nothing else
    assert {k: v for k, v in now["files"].items() if k != "state.json"} == {
        k: v for k, v in seen["files"].items() if k != "state.json"
    }
    assert finish(pro, "files_written").returncode == 0
    if hook != "epilog":
        epilog_clean(rack, t, JOB_A)
        return
    # the epilog marked its job ended before it waited: plain cleanup finishes what it could not do
    done = rack.imexctl(t, "cleanup")
    assert done.returncode == 0 and f"job {JOB_A}" in done.stdout and "skipped" not in done.stdout, done.stdout
    assert rack.dirty() == []


def test_lock_of_a_killed_holder_is_free(make_rack: MakeRack) -> None:
    """The holder dies by SIGKILL inside the lock: the kernel drops the flock, the next prolog goes at once."""
    rack, t = tray(make_rack, daemon={"lock_timeout_s": "1"})
    pro = paused(rack, t, "prolog", JOB_A, "claimed")
    assert rack.lock_held(t)
    pro.proc.kill()
    assert pro.result().returncode == -9
    assert (t.root / "run/imexctl/lock").exists() and not rack.lock_held(t)
    up(rack, t, JOB_B)
    epilog_clean(rack, t, JOB_B)


def _lock_mode_0644(lock: Path, _target: Path) -> None:
    lock.touch(mode=0o644)
    lock.chmod(0o644)


def _lock_of_another_user(lock: Path, _target: Path) -> None:
    lock.touch(mode=0o600)
    os.chown(lock, 4242, 4242)


def _lock_symlink(lock: Path, target: Path) -> None:
    target.write_text("precious\n")
    lock.symlink_to(target)


def _lock_dangling_symlink(lock: Path, target: Path) -> None:
    lock.symlink_to(target)


@pytest.mark.parametrize(
    ("hook", "make", "says"),
    [
        ("prolog", _lock_mode_0644, "with mode 0600, not a regular file of uid 0 with mode 0644"),
        ("prolog", _lock_of_another_user, "not a regular file of uid 4242 with mode 0600"),
        ("prolog", _lock_symlink, "is a symbolic link (not followed)"),
        ("prolog", _lock_dangling_symlink, "is a symbolic link (not followed)"),
        ("cleanup", _lock_symlink, "is a symbolic link (not followed)"),
        ("cleanup", _lock_mode_0644, "with mode 0600, not a regular file of uid 0 with mode 0644"),
    ],
)
def test_hostile_lock_file_is_refused(make_rack: MakeRack, hook: str, make: Callable[..., None], says: str) -> None:
    """A lock file others could hold, or a symlink at its path: refused (71), nothing followed or left."""
    rack, t = tray(make_rack)
    lock, target = t.root / "run/imexctl/lock", rack.base / "target"
    lock.parent.mkdir(parents=True)
    make(lock, target)
    before = target.read_text() if target.exists() else None
    res, _ = rack.run(t, hook, JOB_A)
    assert res.returncode == FILE_FAILED and says in res.output, res.output
    assert (target.read_text() if target.exists() else None) == before
    assert domain(t, JOB_A) == {"files": {}, "daemon": [], "channel": None}


# ---------------------------------------------------------------- policy paths, end to end


def _without_the_lock(rack: FaultRack, t: Tray, *envs: dict[str, str]) -> list[str]:
    """Prologs of job A with each of ``envs`` while an IMEX job holds the lock: each ends at once, touching nothing.

    Returns:
        Sorted: each prolog's exit code with its ``skipped`` reason, or with its output when it failed.
    """
    holder = paused(rack, t, "prolog", JOB_B, "locked", env={"SLURM_JOB_CONSTRAINTS": "imex"})
    runs = [rack.start(t, "prolog", JOB_A, env=env) for env in envs]
    results = [r.result() for r in runs]
    assert all("locked" not in r.steps() for r in runs)
    assert domain(t, JOB_A) == {"files": {}, "daemon": [], "channel": None}
    assert finish(holder, "locked").returncode == 0
    epilog_clean(rack, t, JOB_A, JOB_B)
    lines = (json.loads(line) for line in (t.root / "var/log/imexctl.log").read_text().splitlines())
    skipped = [rec["skipped"] for rec in lines if rec["event"] == "prolog.done" and "skipped" in rec]
    failed = [r for r in results if r.returncode]
    assert len(skipped) + len(failed) == len(envs)
    return sorted([f"0 {why}" for why in skipped] + [f"{r.returncode} {r.output}" for r in failed])


def test_shared_job_is_refused(make_rack: MakeRack) -> None:
    """``[policy] shared = refuse``: a job that may share its nodes fails with 69, before the lock."""
    rack, t = tray(make_rack, policy={"shared": "refuse"})
    values = ["YES", "OK", "FORCE"]
    outs = _without_the_lock(rack, t, *({"SLURM_JOB_OVERSUBSCRIBE": v} for v in values))
    assert len(outs) == 3 and all(out.startswith(f"{BUSY} ") for out in outs), outs
    for value in values:
        assert any(f"SLURM_JOB_OVERSUBSCRIBE={value}); an IMEX domain needs whole trays" in out for out in outs), outs
        assert all("--exclusive" in out and "shared = refuse" in out for out in outs), outs


def test_shared_job_is_skipped(make_rack: MakeRack) -> None:
    """``[policy] shared = skip`` (the default): the prolog exits 0 and sets up nothing; an exclusive job still
    gets its domain."""
    rack, t = tray(make_rack)
    envs = ({"SLURM_JOB_OVERSUBSCRIBE": "YES"}, {"SLURM_JOB_OVERSUBSCRIBE": "NO", "SLURM_JOB_EXCLUSIVE": "USER"})
    outs = _without_the_lock(rack, t, *envs)
    assert [out.split(")")[0] for out in outs] == [
        "0 the job may share its trays with other jobs (SLURM_JOB_EXCLUSIVE=USER SLURM_JOB_OVERSUBSCRIBE=NO",
        "0 the job may share its trays with other jobs (SLURM_JOB_OVERSUBSCRIBE=YES",
    ], outs
    up(rack, t, JOB_A)  # the rack's environment has no SLURM_JOB_OVERSUBSCRIBE (Slurm < 23.02): not refused
    res, _ = rack.run(t, "prolog", JOB_B, env={"SLURM_JOB_OVERSUBSCRIBE": "NO"})
    assert res.returncode == BUSY  # exclusive, and A owns the domain
    epilog_clean(rack, t, JOB_A)


def test_feature_gate(make_rack: MakeRack) -> None:
    """``[policy] jobs = feature``: only jobs that ask for the feature with --constraint get a domain."""
    rack, t = tray(make_rack, policy={"jobs": "feature", "feature": "imex"})
    outs = _without_the_lock(rack, t, *({"SLURM_JOB_CONSTRAINTS": c} for c in ("gpu", "", "imexx", "imex-2")))
    assert outs == ["0 job did not request feature 'imex' (--constraint)"] * 4, outs
    for constraints in ("gpu&imex", "[rack2|imex]*2"):
        res, _ = rack.run(t, "prolog", JOB_A, env={"SLURM_JOB_CONSTRAINTS": constraints})
        assert res.returncode == 0 and domain(t, JOB_A)["daemon"], res.output
        epilog_clean(rack, t, JOB_A)


def test_partition_gate(make_rack: MakeRack) -> None:
    """``[policy] jobs = partitions``: a job in another partition is skipped, one in the list gets its domain."""
    rack, t = tray(make_rack, policy={"jobs": "partitions", "partitions": "nvl72,gb300"})
    outs = _without_the_lock(rack, t, {"SLURM_JOB_PARTITION": "cpu"}, {"SLURM_JOB_PARTITION": ""})
    assert outs == ["0 partition ? is not in [policy] partitions", "0 partition cpu is not in [policy] partitions"]
    res, _ = rack.run(t, "prolog", JOB_A, env={"SLURM_JOB_PARTITION": "gb300"})
    assert res.returncode == 0, res.output
    epilog_clean(rack, t, JOB_A)


def test_channels_none_never_touches_channel_nodes(make_rack: MakeRack) -> None:
    """``[policy] channels = none``: a domain without a channel, even with no IMEX entry in /proc/devices;
    channel nodes found there (another job's, or Slurm's) survive prolog, epilog and cleanup."""
    rack, t = tray(make_rack, policy={"channels": "none"})
    (t.root / "proc/devices").write_text("Character devices:\n195 nvidia\nBlock devices:\n")
    chan_dir = t.root / "dev/nvidia-caps-imex-channels"
    chan_dir.mkdir(parents=True)
    stray = chan_dir / f"channel{1 + JOB_A % 2047}"  # exactly where the job's channel would go
    os.mknod(stray, stat.S_IFCHR | 0o600, os.makedev(234, 1 + JOB_A % 2047))
    before = stray.lstat()
    res, _ = rack.run(t, "prolog", JOB_A)
    assert res.returncode == 0, res.output
    state = json.loads((job_dir(t, JOB_A) / "state.json").read_text())
    assert state["channel_minor"] is None and state["channel_path"] == "" and domain(t, JOB_A)["daemon"]
    assert last(t, "prolog.done", JOB_A)["channel"] == ""
    for args in (("cleanup", "--force"), ("cleanup",)):
        assert rack.imexctl(t, *args).returncode == 0
    res, _ = rack.run(t, "epilog", JOB_A)
    assert res.returncode == 0
    after = stray.lstat()
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev, before.st_mode)
    stray.unlink()
    assert rack.dirty() == []
