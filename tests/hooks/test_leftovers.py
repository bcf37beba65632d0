"""Leftovers and liveness decided on facts (issue 32, sections 2 and 4), over FakeHost with real files.

- One liveness rule (``jobs.still_runs`` over ``daemon.daemon_runs``): cleanup, the prolog's claim, status
  and doctor agree that a daemon runs when ``/proc`` shows it, or else when its backend says so, and a
  backend that cannot be asked counts as running.
- Stray daemons (an IMEX daemon under the jobs directory that names no job): found, and a prolog refuses
  the tray while one runs.
- The epilog of a job that left no ``state.json`` leaves a channel of the same minor that another job claims.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.commands.status import collect
from imexctl.config.settings import Settings
from imexctl.doctor import framework as doctor
from imexctl.doctor.checks import stale_checks
from imexctl.hooks.jobs import scan_jobs, still_runs
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import cleanup, epilog
from imexctl.platform.errors import DomainBusyError
from tests.support.fakes import JOB_GID, FakeGpu, FakeHost, SlurmJob, job_env

#: where a driver branch's copy of the daemon lives once ``[commands] nvidia_imex`` (a symlink) points elsewhere
OLD_BRANCH = "/usr/lib/nvidia/580/nvidia-imex"


def runtime(host: FakeHost, make_settings: Callable[..., Settings], backend: str = "exec") -> Runtime:
    rt = Runtime(host, FakeGpu(), make_settings(daemon={"backend": backend}), structlog.get_logger())
    host.unit_exec = f"/usr/bin/nvidia-imex -c {rt.settings.paths.jobs_dir}/{{job}}/config.cfg"
    return rt


def daemon_of(host: FakeHost, rt: Runtime, job_id: int) -> Any:
    """The job's one live daemon in the fake's process table."""
    config = str(rt.settings.paths.job(job_id).config)
    (proc,) = [p for p in host.procs.values() if p.alive and config in p.info.cmdline]
    return proc


def move_program(host: FakeHost, rt: Runtime, job_id: int) -> int:
    """The driver branch's symlink moves: the job's daemon still runs, its executable is no longer the program."""
    proc = daemon_of(host, rt, job_id)
    proc.info = proc.info._replace(exe=OLD_BRANCH)
    assert not [p for p in host.processes_with_arg(str(rt.settings.paths.job(job_id).config)) if p.exe != OLD_BRANCH]
    return int(proc.info.pid)


class TestOneLivenessRule:
    @pytest.mark.parametrize("backend", ["exec", "systemd"])
    def test_a_daemon_whose_program_moved_under_it_still_runs(
        self, host: FakeHost, make_settings: Callable[..., Settings], backend: str
    ) -> None:
        """/proc no longer ties job 42's daemon to ``[commands] nvidia_imex``; its backend says it runs: cleanup
        leaves it, status and doctor call it running, another job's prolog is refused."""
        rt = runtime(host, make_settings, backend)
        assert prolog(job_env(job_id=42), rt).ok
        pid = move_program(host, rt, 42)
        report = cleanup(rt).data()
        assert report["actions"] == [] and len(report["skipped"]) == 1, report
        assert report["skipped"][0].startswith("job 42 may still run on this node"), report
        assert daemon_of(host, rt, 42).info.pid == pid and not [s for s in host.signals if s[0] == pid]
        assert rt.settings.paths.job(42).exists()
        job = collect(rt, "gb01").data()["jobs"][0]
        assert job["running"] is True and job["stale"] == [], job
        stale = stale_checks(doctor.Context(rt, {}, "gb01"))[0]
        assert stale.status == doctor.OK, stale
        with pytest.raises(DomainBusyError, match="belongs to job 42, which may still run on this node"):
            prolog(job_env(job_id=43), rt)

    def test_a_backend_that_cannot_be_asked_counts_as_running(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """systemd backend, the daemon out of /proc's sight and ``systemctl show`` failing: nothing is stopped."""
        rt = runtime(host, make_settings, "systemd")
        assert prolog(job_env(job_id=42), rt).ok
        pid = move_program(host, rt, 42)
        host.fail_verbs.add("show")
        live = still_runs(42, rt)
        assert live.runs and not live.seen and "backend cannot be asked" in live.why, live
        report = cleanup(rt).data()
        assert report["actions"] == [] and "(the systemd backend cannot be asked)" in report["skipped"][0], report
        assert daemon_of(host, rt, 42).info.pid == pid and not [c for c in host.calls if c[1:2] == ("stop",)]
        assert collect(rt, "gb01").data()["jobs"][0]["running"] is True

    def test_a_daemon_its_backend_says_is_gone_is_cleared(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """Control: the moved daemon really exits, the backend says so, and cleanup removes the job's leftovers."""
        rt = runtime(host, make_settings)
        assert prolog(job_env(job_id=42), rt).ok
        move_program(host, rt, 42)
        daemon_of(host, rt, 42).alive = False
        assert not still_runs(42, rt).runs
        assert cleanup(rt).data()["skipped"] == [] and not rt.settings.paths.job(42).exists()

    @pytest.mark.parametrize("backend", ["exec", "systemd"])
    def test_the_epilog_waits_for_the_driver_clients_of_a_daemon_out_of_sight(
        self, host: FakeHost, make_settings: Callable[..., Settings], backend: str
    ) -> None:
        """/proc no longer ties job 42's daemon to ``[commands] nvidia_imex``, its backend says it runs: the epilog
        still waits for the job user's processes that hold the driver before it stops the daemon, and reports
        the busy stop (the driver would kill them, with exports left, and refuse fabric allocations)."""
        rt = runtime(host, make_settings, backend)
        rt = rt._replace(settings=make_settings(daemon={"backend": backend, "process_wait_s": 3}))
        assert prolog(job_env(job_id=42), rt).ok
        pid = move_program(host, rt, 42)
        stuck = host.add_process(["/home/alice/train"], uid=1000, driver=True)
        t0 = host.monotonic()
        out = epilog(job_env(job_id=42), rt)
        assert host.monotonic() - t0 >= 3.0 and len(out.busy_stop) == 1, out
        assert out.busy_stop[0].startswith(f"the IMEX daemon of job 42 is stopped while pid {stuck.pid} of uid 1000")
        assert out.ok and not host.procs[pid].alive and host.is_alive(stuck)

    def test_an_epilog_stops_a_unit_that_runs_out_of_sight_without_its_directory(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """Job 42's directory is gone, /proc misses its daemon (program moved) and systemd says its unit runs:
        the job left something, so its epilog is no idle one, and it stops the unit (and, its state lost, takes
        the one channel of its uid).  An epilog of a job of which nothing at all names the config asks systemd
        nothing."""
        from imexctl.hooks.teardown import idle_epilog
        from imexctl.slurm.job import JobContext

        rt = runtime(host, make_settings, "systemd")
        assert prolog(job_env(job_id=42), rt).ok
        pid = move_program(host, rt, 42)
        shutil.rmtree(rt.settings.paths.job(42).path)
        host.calls.clear()
        assert idle_epilog(JobContext.from_env(job_env(job_id=7), need_nodes=False), rt) is not None
        assert not [c for c in host.calls if c[0].endswith("systemctl")], host.calls
        assert idle_epilog(JobContext.from_env(job_env(job_id=42), need_nodes=False), rt) is None
        out = epilog(job_env(job_id=42), rt)
        # its uid's one channel, where the fake made it for real (as root: CAP_MKNOD)
        taken = ["remove_channel"] if host.real_nodes else []
        assert [a.kind for a in out.actions] == ["stop_daemon", *taken] and out.ok, out
        assert host.units["imexctl-imex@42.service"]["ActiveState"] == "inactive" and not host.procs[pid].alive

    def test_the_answer_has_no_truth_value(self, rt: Runtime) -> None:
        """``if still_runs(...)`` would keep every job (a record is a non-empty tuple): it raises instead."""
        with pytest.raises(TypeError, match="ask its runs"):
            bool(still_runs(42, rt))


class TestStrayDaemons:
    def _jobs_dir(self, rt: Runtime) -> str:
        return str(rt.settings.paths.jobs_dir)

    def test_a_daemon_under_the_jobs_directory_that_names_no_job_is_a_stray(self, rt: Runtime, host: FakeHost) -> None:
        """One scan: job 7's daemon counts for job 7; daemons that name no job id are strays; a pager, another
        user's copy of the program and root's ctl client are neither."""
        jobs = self._jobs_dir(rt)
        imex = rt.settings.commands.nvidia_imex
        host.add_process([imex, "-c", f"{jobs}/7/config.cfg"])
        stray = host.add_process([imex, "-c", f"{jobs}/old/config.cfg"])
        bare = host.add_process([imex, "-c", f"{jobs}/config.cfg"])
        host.add_process(["/usr/bin/less", f"{jobs}/x/config.cfg"], uid=1000)
        host.add_process([imex, "-c", f"{jobs}/y/config.cfg"], uid=1000)
        host.add_process(["/usr/bin/nvidia-imex-ctl", "-c", f"{jobs}/z/config.cfg", "-q"])
        found, strays = scan_jobs(rt)
        assert found == [7] and strays == [stray, bare], (found, strays)

    def test_a_prolog_refuses_a_tray_where_a_stray_daemon_runs(self, rt: Runtime, host: FakeHost, root: Path) -> None:
        """The stray may serve anybody's domain: the prolog fails naming it, starts nothing and signals nobody."""
        cmd = [rt.settings.commands.nvidia_imex, "-c", f"{self._jobs_dir(rt)}/old/config.cfg"]
        stray = host.add_process(cmd)
        with pytest.raises(DomainBusyError, match=rf"a stray IMEX daemon runs \(pid {stray.pid}: {' '.join(cmd)}\)"):
            prolog(job_env(job_id=42), rt)
        assert not [c for c in host.calls if c[0] == "spawn"] and host.signals == [] and host.mknods == []
        assert not rt.settings.paths.job(42).exists() and host.procs[stray.pid].alive


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: real channel device nodes (CAP_MKNOD)")


@needs_root
class TestEpilogChannelGuard:
    """Jobs 42 and 2089 have the same channel minor (43 with 2048 channels): one's epilog never takes the other's."""

    @pytest.mark.parametrize(
        ("other_state", "uid"),
        [
            pytest.param("claims-minor-43", 1234, id="claims-minor-43"),
            pytest.param("unreadable", 1234, id="unreadable"),
            pytest.param("unreadable", 1000, id="unreadable-same-user"),
        ],
    )
    def test_a_stateless_jobs_epilog_leaves_a_channel_another_job_claims(
        self, rt: Runtime, real_nodes: FakeHost, root: Path, other_state: str, uid: int
    ) -> None:
        """Job 42's prolog died before its state.json; job 2089's channel43 stays through 42's epilog, whether
        2089's state names minor 43 or cannot be read (it may), also when 2089 is a job of 42's own user (uid
        1000): its channel is then the one node of that uid that no readable state claims."""
        assert prolog(job_env(job_id=2089, uid=uid), rt).ok
        chan = rt.settings.paths.channel_dir / "channel43"
        if other_state == "unreadable":
            rt.settings.paths.job(2089).state.write_text('{"job_id": 20')
        rt.settings.paths.job(42).path.mkdir()
        before = os.lstat(chan)
        out = epilog(job_env(job_id=42), rt)
        assert [a.kind for a in out.actions] == ["stop_daemon", "remove_job_dir"], out.actions
        after = os.lstat(chan)
        assert (after.st_ino, after.st_uid, after.st_gid) == (before.st_ino, uid, JOB_GID)
        assert not rt.settings.paths.job(42).exists() and len([p for p in real_nodes.procs.values() if p.alive]) == 1

    def test_a_stateless_jobs_epilog_removes_its_own_channel(
        self, rt: Runtime, real_nodes: FakeHost, root: Path
    ) -> None:
        """Control: no other job claims minor 43, so job 42's epilog removes channel43 (its state was lost)."""
        assert prolog(job_env(job_id=42), rt).ok
        rt.settings.paths.job(42).state.unlink()
        out = epilog(job_env(job_id=42), rt)
        assert "remove_channel" in [a.kind for a in out.actions]
        assert not os.path.lexists(rt.settings.paths.channel_dir / "channel43")


#: slurmd's word on which run of job 42 this is (credential: SLURM_JOB_RESTART_COUNT 22.05+, START_TIME 23.02+)
RUN = {"SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_START_TIME": "1796434004"}


class TestPrologTwice:
    """slurmd restarted during a prolog runs it again for the same job: a finished domain of the run stays."""

    def _events(self, logs: list[dict[str, Any]]) -> list[str]:
        return [e["event"] for e in logs]

    @pytest.mark.parametrize("backend", ["exec", "systemd"])
    def test_the_second_prolog_keeps_the_finished_domain_untouched(
        self, host: FakeHost, make_settings: Callable[..., Settings], backend: str
    ) -> None:
        """Nothing written, started, stopped or made again: the same daemon and state.json, exit 0, ready."""
        from structlog.testing import capture_logs

        rt = runtime(host, make_settings, backend)
        assert prolog(job_env(job_id=42, **RUN), rt).ok
        jd = rt.settings.paths.job(42)
        files = {p.name: (p.stat().st_ino, p.read_bytes()) for p in jd.path.iterdir()}
        pid, calls, mknods = daemon_of(host, rt, 42).info.pid, len(host.calls), list(host.mknods)
        with capture_logs() as logs:
            again = prolog(job_env(job_id=42, **RUN), rt)
        assert again.ok and again.setup is not None and again.setup.ready and again.setup.port == 61042
        assert "imex.domain.kept" in self._events(logs) and "state.removed" not in self._events(logs), logs
        assert daemon_of(host, rt, 42).info.pid == pid and host.signals == [] and host.mknods == mknods
        later = host.calls[calls:]
        assert not [c for c in later if c[0] == "spawn" or c[1:2] in (("start",), ("stop",))], later
        assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in jd.path.iterdir()} == files

    def test_without_a_start_time_the_restart_count_decides(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """Slurm 22.05 gives no SLURM_JOB_START_TIME: the same restart count and the rest keep the domain."""
        rt = runtime(host, make_settings)
        env = job_env(job_id=42, SLURM_JOB_RESTART_COUNT="0")
        assert prolog(env, rt).ok
        pid = daemon_of(host, rt, 42).info.pid
        assert prolog(env, rt).ok and daemon_of(host, rt, 42).info.pid == pid and host.signals == []

    @pytest.mark.parametrize(
        ("change", "why"),
        [
            pytest.param({"SLURM_JOB_RESTART_COUNT": "1"}, "another run", id="requeued"),
            pytest.param({"SLURM_JOB_START_TIME": "1796439999"}, "another run", id="another-start"),
            pytest.param({"SLURM_JOB_NODELIST": "gb[01,03]"}, "tray list", id="other-trays"),
            pytest.param({"SLURM_JOB_UID": "1001"}, "owner", id="other-user"),
        ],
    )
    def test_a_domain_of_another_run_is_torn_down_and_built_again(
        self, host: FakeHost, make_settings: Callable[..., Settings], change: dict[str, str], why: str
    ) -> None:
        """A leftover of job 42 that is not this run's (requeued, id reused, other trays or user) goes first."""
        from structlog.testing import capture_logs

        rt = runtime(host, make_settings)
        assert prolog(job_env(job_id=42, **RUN), rt).ok
        first = daemon_of(host, rt, 42).info.pid
        with capture_logs() as logs:
            assert prolog(job_env(job_id=42, **{**RUN, **change}), rt).ok
        removed = [e for e in logs if e["event"] == "state.removed"]
        assert len(removed) == 1 and "leftovers of an earlier run of this job" in removed[0]["reason"], logs
        assert why in removed[0]["reason"] and "imex.domain.kept" not in self._events(logs)
        assert not host.procs[first].alive and daemon_of(host, rt, 42).info.pid != first

    @pytest.mark.parametrize("left", ["daemon-gone", "not-finished", "epilog-ran"])
    def test_a_domain_that_is_not_whole_is_torn_down_and_built_again(
        self, host: FakeHost, make_settings: Callable[..., Settings], left: str
    ) -> None:
        """Its daemon died, its prolog never finished (no set_up mark) or its epilog began: built anew."""
        rt = runtime(host, make_settings)
        assert prolog(job_env(job_id=42, **RUN), rt).ok
        first = daemon_of(host, rt, 42)
        state = rt.settings.paths.job(42).state
        data = json.loads(state.read_text())
        if left == "daemon-gone":
            first.alive = False
        else:
            data.update({"set_up": 0.0} if left == "not-finished" else {"ended": 5.0})
            state.write_text(json.dumps(data))
        assert prolog(job_env(job_id=42, **RUN), rt).ok
        assert daemon_of(host, rt, 42).info.pid != first.info.pid and not first.alive

    def test_a_kept_domain_that_does_not_get_ready_fails_as_a_set_up_would(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """The second prolog waits for readiness like the first: never ready by the deadline, it fails and rolls
        back (the job is requeued; its epilog would tear the domain down anyway)."""
        from imexctl.platform.errors import HealthTimeout

        rt = runtime(host, make_settings)
        assert prolog(job_env(job_id=42, **RUN), rt).ok
        host.q_outputs = [(0, "WAITING_FOR_PEERS\n")]
        with pytest.raises(HealthTimeout):
            prolog(job_env(job_id=42, **RUN), rt)
        assert not rt.settings.paths.job(42).exists() and not [p for p in host.procs.values() if p.alive]


class TestClaimBelievesRunningOnlyForThisTray:
    """Job 7 left a set-up domain on gb01 (daemon running, no slurmstepd here, epilog never ran); job 8's prolog
    on gb01 asks slurmctld about it once, and counts it live only if it runs on gb01 in the run that left it."""

    START = 1796434004

    def _left_by_job_7(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path, **env: str) -> Runtime:
        rt = runtime(host, make_settings)
        (root / "slurm.conf").write_text("ClusterName=x\nNodeName=gb[01-18]\n")  # the channel's clique
        more = {"SLURM_CONF": str(root / "slurm.conf"), "SLURM_JOB_OVERSUBSCRIBE": "NO", **env}
        assert prolog(job_env(job_id=7, **more), rt).ok
        return rt

    def _job_8(self, rt: Runtime, root: Path) -> Any:
        env = job_env(job_id=8, SLURM_CONF=str(root / "slurm.conf"), SLURM_JOB_OVERSUBSCRIBE="NO", **RUN)
        return prolog(env, rt)

    def _asked(self, host: FakeHost) -> list[str]:
        return [c[5] for c in host.calls if c[0].endswith("squeue")]

    @pytest.mark.parametrize(
        ("record", "cleared", "why"),
        [
            pytest.param({}, False, "", id="same-run-here"),
            pytest.param({"nodes": "gb[05-06]", "restarts": 1}, True, "runs on gb[05-06], not on this tray",
                         id="requeued-elsewhere"),
            pytest.param({"nodes": "gb[05-06]"}, True, "runs on gb[05-06], not on this tray", id="elsewhere"),
            pytest.param({"restarts": 1}, True, "restart count 1, the leftovers' 0", id="requeued-here"),
            pytest.param({"start_time": START + 3600}, True, "another run: it started at", id="id-reused"),
            pytest.param({"state": "PENDING", "nodes": ""}, True, "slurmctld says PENDING", id="pending"),
        ],
    )  # fmt: skip
    def test_slurmctlds_answer_counts_only_for_this_tray_and_run(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path, record: dict[str, Any],
        cleared: bool, why: str,
    ) -> None:  # fmt: skip
        """RUNNING elsewhere (requeued after a node failure) or in another run (requeued, id reused after a state
        reset) clears the leftovers as any gone job's; RUNNING here in the same run keeps the tray refused."""
        from structlog.testing import capture_logs

        rt = self._left_by_job_7(host, make_settings, root, **RUN)
        host.slurm_jobs[7] = SlurmJob(7, **{"nodes": "gb[01-02]", "start_time": self.START, **record})
        with capture_logs() as logs:
            if cleared:
                assert self._job_8(rt, root).ok
            else:
                with pytest.raises(DomainBusyError, match="belongs to job 7, which may still run on this node"):
                    self._job_8(rt, root)
        assert self._asked(host) == ["--jobs=7"]
        removed = [e["reason"] for e in logs if e["event"] == "state.removed"]
        assert len(removed) == int(cleared), removed
        if cleared:
            assert removed[0].startswith("leftovers of job 7, which no longer runs here (") and why in removed[0]
        assert rt.settings.paths.job(7).exists() is not cleared

    @pytest.mark.parametrize(("late_s", "cleared"), [(10, False), (3600, True)])
    def test_leftovers_that_do_not_say_their_run_are_judged_by_when_they_were_made(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path, late_s: int, cleared: bool
    ) -> None:
        """No restart count or start time recorded (a prolog without them, an older imexctl): slurmctld's start
        within the clocks' slack of ``created`` may be the same run; an hour later it is another."""
        rt = self._left_by_job_7(host, make_settings, root)
        created = int(json.loads(rt.settings.paths.job(7).state.read_text())["created"])
        host.slurm_jobs[7] = SlurmJob(7, nodes="gb[01-02]", start_time=created + late_s)
        if cleared:
            assert self._job_8(rt, root).ok
        else:
            with pytest.raises(DomainBusyError, match="belongs to job 7"):
                self._job_8(rt, root)
        assert rt.settings.paths.job(7).exists() is not cleared

    def test_a_joint_het_domain_counts_every_components_trays(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """Job 7 is a het job whose leader runs on gb05 and whose component 1 (job 8's id is not used) on
        gb[01-02]: its joint domain here is live; slurmctld is asked for the components too."""
        rt = self._left_by_job_7(host, make_settings, root, **RUN)
        host.slurm_jobs[7] = SlurmJob(7, nodes="gb05", start_time=self.START, het_job_id=7, het_job_offset=0)
        host.slurm_jobs[9] = SlurmJob(9, nodes="gb[01-02]", start_time=self.START, het_job_id=7, het_job_offset=1)
        with pytest.raises(DomainBusyError, match="belongs to job 7"):
            self._job_8(rt, root)
        assert self._asked(host) == ["--jobs=7", "--jobs=7"]

    def test_no_answer_keeps_the_job(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """slurmctld does not know job 7 (or cannot be asked): the tray stays refused, as before."""
        rt = self._left_by_job_7(host, make_settings, root, **RUN)
        with pytest.raises(DomainBusyError, match="belongs to job 7"):
            self._job_8(rt, root)
        assert self._asked(host) == ["--jobs=7"]
