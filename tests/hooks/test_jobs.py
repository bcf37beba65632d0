"""Is this job gone: a typed answer (``Liveness``), decided on the tray, and slurmctld asked in its doubt in one place."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.hooks.jobs import GONE, Liveness, epilog_pending, still_runs, still_runs_here
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import node_lock, read_state
from imexctl.hooks.teardown import epilog
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, job_env

#: the run job 7's prolog was: its restart count and start time as slurmd gave them
RUN = {"SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_START_TIME": "1796434004"}


@pytest.fixture
def left(host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> tuple[Runtime, str]:
    """Job 7's set-up domain on gb01, its daemon running, no slurmstepd here: the tray's evidence is in doubt."""
    rt = Runtime(host, FakeGpu(), make_settings(), structlog.get_logger())
    conf = root / "slurm.conf"
    conf.write_text("ClusterName=x\nNodeName=gb[01-18]\n")  # the trays: the channel's clique
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


# ---------------------------------------------------------------- an epilog in flight (issue 41)

#: an epilog's worst case, each wait longer than the old window (lock + stop + grace + 10 s) alone
SLOW = {"process_wait_s": 100, "lock_timeout_s": 60, "stop_timeout_s": 3, "kill_grace_s": 2}


def _slow_epilog(host: FakeHost, make_settings: Callable[..., Settings], **env: str) -> tuple[Runtime, dict[str, str]]:
    """Job 42's domain, set up; a process of its user that holds the driver and never leaves; a daemon that
    ignores SIGTERM: its epilog waits the whole process_wait_s, then its stop timeout and its SIGKILL grace."""
    host.daemon_ignores_sigterm = True
    rt = Runtime(host, FakeGpu(), make_settings(daemon=SLOW), structlog.get_logger())
    jobs = job_env(job_id=42, **env)
    assert prolog(jobs, rt).ok
    host.add_process(["/home/alice/train"], uid=1000, driver=True)
    return rt, jobs


def test_an_epilog_is_in_flight_at_every_pause_of_its_worst_case(
    host: FakeHost, make_settings: Callable[..., Settings]
) -> None:
    """After its mark the epilog waits for the job user's driver clients (process_wait_s 100), for the node lock
    (another hook holds it for all but the last second of lock_timeout_s), for the daemon's stop (stop_timeout_s)
    and its SIGKILL grace (kill_grace_s): at every one of its pauses health and doctor see it in flight
    (epilog_pending), never a stale daemon."""
    rt, env = _slow_epilog(host, make_settings)
    lock = contextlib.ExitStack()
    lock.enter_context(node_lock(rt.settings.paths.lock_file, host, 1))
    marked: list[float] = []
    judged: list[tuple[float, bool]] = []
    sleep = host.sleep

    def pause(seconds: float) -> None:
        state = read_state(rt.settings.paths.job(42))
        if state is not None and state.ended:
            marked[:] = marked or [host.now]
            judged.append((host.now - marked[0], epilog_pending(42, rt)))
            if host.now - marked[0] >= SLOW["process_wait_s"] + SLOW["lock_timeout_s"] - 1:
                lock.close()  # the other hook lets go just in time
        sleep(seconds)

    host.sleep = pause  # type: ignore[method-assign]
    out = epilog(env, rt)
    assert out.ok and out.busy_stop and not rt.settings.paths.job(42).exists()
    waited = max(t for t, _ in judged)
    assert waited > SLOW["process_wait_s"] + SLOW["lock_timeout_s"] + SLOW["stop_timeout_s"], judged[-3:]
    assert [(t, p) for t, p in judged if not p] == []


def test_an_epilog_that_gave_up_is_in_flight_only_until_its_recorded_deadline(
    host: FakeHost, make_settings: Callable[..., Settings]
) -> None:
    """The epilog's lock wait times out: what it marked stays for cleanup.  Its deadline, recorded with the mark,
    covers every wait it would have made; once that has passed, its leftovers are no longer in flight, whatever
    today's settings say."""
    from imexctl.platform.errors import LockTimeout

    rt, env = _slow_epilog(host, make_settings)
    with node_lock(rt.settings.paths.lock_file, host, 1), pytest.raises(LockTimeout):
        epilog(env, rt)
    state = read_state(rt.settings.paths.job(42))
    assert state is not None and state.ended and state.epilog_deadline > state.ended
    assert state.epilog_deadline - state.ended >= sum(SLOW.values())
    assert epilog_pending(42, rt)
    host.now = state.epilog_deadline - host.time() + host.now - 0.5
    assert epilog_pending(42, rt)
    fast = rt._replace(settings=make_settings())  # the settings changed since: the recorded deadline stands
    assert epilog_pending(42, fast)
    host.now += 1
    assert not epilog_pending(42, rt) and not epilog_pending(42, fast)


def test_a_state_without_a_recorded_deadline_counts_every_wait(
    host: FakeHost, make_settings: Callable[..., Settings]
) -> None:
    """A job an older version's epilog marked (no deadline in its state): in flight until every wait of today's
    settings has passed since the mark, the wait for the job's processes and the lock's included."""
    rt = Runtime(host, FakeGpu(), make_settings(daemon=SLOW), structlog.get_logger())
    assert prolog(job_env(job_id=42), rt).ok
    jd = rt.settings.paths.job(42)
    data = json.loads(jd.state.read_text())
    data.pop("epilog_deadline", None)
    jd.state.write_text(json.dumps({**data, "ended": host.time()}))
    host.now += sum(SLOW.values()) - 1
    assert epilog_pending(42, rt)
    host.now += 60
    assert not epilog_pending(42, rt)
