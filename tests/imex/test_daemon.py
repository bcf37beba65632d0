"""daemon: the systemd and exec backends over FakeHost, and parsing of ``systemctl show``."""

from __future__ import annotations

import errno
import signal
from pathlib import Path
from typing import Callable

import pytest
import structlog

from imexctl.config.paths import JobDir
from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import cleanup, epilog
from imexctl.imex import daemon as daemon_module
from imexctl.imex.daemon import (
    ExecBackend,
    SystemdBackend,
    ensure_gone,
    job_processes,
    make_backend,
    parse_systemctl_show,
)
from imexctl.platform.errors import DaemonError, DomainBusyError, UnsafeNodeError
from imexctl.platform.fsutil import remove_tree
from imexctl.platform.host import ProcInfo
from tests.support.fakes import FakeGpu, FakeHost, _Proc, job_env

UNIT = "imexctl-imex@42.service"
SHOW = """\
Id=imexctl-imex@42.service
LoadState=loaded
ActiveState=active
SubState=running
MainPID=4242
ExecStart={ path=/usr/bin/nvidia-imex ; argv[]=/usr/bin/nvidia-imex -c /run/imexctl/jobs/42/config.cfg ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }

Id=nvidia-imex.service
LoadState=not-found
ActiveState=inactive
SubState=dead
MainPID=0
ExecStart=
"""


class TestParseSystemctlShow:
    def test_two_units_keyed_by_id(self) -> None:
        """Two blank-line separated blocks give two units keyed by their Id."""
        units = parse_systemctl_show(SHOW)
        assert list(units) == ["imexctl-imex@42.service", "nvidia-imex.service"]
        assert units["imexctl-imex@42.service"]["MainPID"] == "4242"
        assert units["nvidia-imex.service"]["LoadState"] == "not-found"

    def test_value_containing_equals_is_kept_whole(self) -> None:
        """Only the first '=' separates key and value (ExecStart contains many)."""
        exec_start = parse_systemctl_show(SHOW)[UNIT]["ExecStart"]
        assert exec_start.startswith("{ path=/usr/bin/nvidia-imex ; argv[]=/usr/bin/nvidia-imex -c ")
        assert exec_start.endswith("status=0/0 }")

    def test_empty_value(self) -> None:
        """An empty property is an empty string, not missing."""
        assert parse_systemctl_show(SHOW)["nvidia-imex.service"]["ExecStart"] == ""

    def test_block_without_id_is_dropped(self) -> None:
        """A block without an Id cannot be attributed and is ignored."""
        assert parse_systemctl_show("LoadState=loaded\n\nId=a.service\nLoadState=masked\n") == {
            "a.service": {"Id": "a.service", "LoadState": "masked"}
        }

    def test_empty_output(self) -> None:
        """No output means no units."""
        assert parse_systemctl_show("") == {}


def test_fake_systemctl_start_records_main_pid() -> None:
    """FakeHost's systemctl start marks the unit active and records the spawned daemon as MainPID."""
    host = FakeHost()
    host.run(("/usr/bin/systemctl", "start", "--", UNIT), timeout_s=1)
    (pid,) = host.procs
    assert host.units[UNIT] == {"ActiveState": "active", "SubState": "running", "Result": "success", "pid": str(pid)}


@pytest.mark.parametrize(
    ("signum", "after"),
    [(signal.SIGKILL, ("failed", "signal", "2", "9")), (signal.SIGTERM, ("inactive", "success", "1", "0"))],
)
def test_fake_systemd_keeps_a_unit_failed_until_reset_failed(signum: int, after: tuple[str, ...]) -> None:
    """As systemd (Restart=no): a main process killed by SIGKILL leaves the unit failed, and a stop leaves it
    failed; only reset-failed clears it. A daemon ended by SIGTERM exits cleanly: inactive, nothing to clear."""
    host = FakeHost()
    host.run(("/usr/bin/systemctl", "start", "--", UNIT), timeout_s=1)
    (proc,) = host.procs.values()
    host.send_signal(proc.info, signum)
    props = ("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")

    def shown() -> dict[str, str]:
        return parse_systemctl_show(host.run(("/usr/bin/systemctl", "show", "--", UNIT), timeout_s=1).stdout)[UNIT]

    assert tuple(shown()[k] for k in props) == after
    host.run(("/usr/bin/systemctl", "stop", "--", UNIT), timeout_s=1)
    assert shown()["ActiveState"] == after[0]
    host.run(("/usr/bin/systemctl", "reset-failed", "--", UNIT), timeout_s=1)
    assert (shown()["ActiveState"], shown()["Result"]) == ("inactive", "success")


@pytest.fixture
def systemd(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(daemon={"backend": "systemd"})


@pytest.fixture
def jd(root: Path) -> JobDir:
    return JobDir(42, root / "run/imexctl/jobs/42")


@pytest.fixture
def config(jd: JobDir) -> Path:
    return jd.config


@pytest.fixture
def shost(host: FakeHost, root: Path) -> FakeHost:
    """A FakeHost whose template unit runs the config under ``root``."""
    host.unit_exec = "/usr/bin/nvidia-imex -c " + str(root) + "/run/imexctl/jobs/{job}/config.cfg"
    return host


def verbs(host: FakeHost) -> list[str]:
    return [c[1] for c in host.calls if c[0].endswith("systemctl")]


class TestSystemdBackend:
    def test_make_backend_follows_setting(self, shost: FakeHost, systemd: Settings) -> None:
        """[daemon] backend picks the backend; an explicit name overrides it."""
        assert isinstance(make_backend(shost, systemd), SystemdBackend)
        assert isinstance(make_backend(shost, systemd, "exec"), ExecBackend)

    def test_start_shows_both_units_then_starts(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir
    ) -> None:
        """start asks systemctl show once for our unit and the stock unit, then starts our unit."""
        SystemdBackend(shost, systemd).start(jd)
        assert shost.calls == [
            (
                "/usr/bin/systemctl",
                "show",
                "--property=Id,LoadState,ActiveState,SubState,Result,MainPID,ExecMainCode,ExecMainStatus,ExecStart,Environment",
                "--",
                UNIT,
                "nvidia-imex.service",
            ),
            ("/usr/bin/systemctl", "start", "--", UNIT),
        ]
        assert shost.units[UNIT]["ActiveState"] == "active"

    @pytest.mark.parametrize("state", ["active", "activating", "reloading"])
    def test_running_stock_unit_is_busy(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir, state: str
    ) -> None:
        """A running stock nvidia-imex.service refuses the start and says how to disable it."""
        shost.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": state}
        with pytest.raises(DomainBusyError, match=r"nvidia-imex.service is running.*disable --now nvidia-imex"):
            SystemdBackend(shost, systemd).start(jd)
        assert verbs(shost) == ["show"]

    def test_failed_stock_unit_is_not_busy(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A stock unit that is loaded but failed does not block the job."""
        shost.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "failed"}
        SystemdBackend(shost, systemd).start(jd)
        assert verbs(shost) == ["show", "start"]

    def test_unit_not_loaded(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A template unit that is not installed is a DaemonError naming the unit and its LoadState."""
        shost.units[UNIT] = {"LoadState": "not-found"}
        with pytest.raises(DaemonError, match=rf"{UNIT}: unit not loaded \(not-found\)"):
            SystemdBackend(shost, systemd).start(jd)
        assert verbs(shost) == ["show"]

    def test_exec_start_mismatch_names_both(self, host: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A unit whose ExecStart runs another config is refused, naming what we want and what it runs."""
        with pytest.raises(DaemonError) as info:
            SystemdBackend(host, systemd).start(jd)  # default unit_exec: /run/imexctl, not under root
        message = str(info.value)
        assert f"'/usr/bin/nvidia-imex -c {config}'" in message
        assert "argv[]=/usr/bin/nvidia-imex -c /run/imexctl/jobs/42/config.cfg" in message
        assert verbs(host) == ["show"]

    def test_exec_start_prefix_is_not_enough(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir
    ) -> None:
        """A config path that merely starts with ours (job 420 for job 42) does not match."""
        shost.unit_exec = "/usr/bin/nvidia-imex -c " + str(config.parent) + "0/config.cfg"
        with pytest.raises(DaemonError, match="ExecStart does not run"):
            SystemdBackend(shost, systemd).start(jd)

    def test_start_failure_carries_stderr(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A failing systemctl start is a DaemonError with systemctl's stderr."""
        shost.fail_verbs.add("start")
        with pytest.raises(DaemonError, match=rf"systemctl start {UNIT}: exit 1: Job for {UNIT} failed\."):
            SystemdBackend(shost, systemd).start(jd)

    def test_show_failure(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A failing systemctl show is a DaemonError and nothing is started."""
        shost.fail_verbs.add("show")
        with pytest.raises(DaemonError, match="systemctl show .*exit 1"):
            SystemdBackend(shost, systemd).start(jd)
        assert verbs(shost) == ["show"]

    def test_start_waits_for_the_exec(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """Type=simple: systemctl start returns before the daemon's exec; start waits until a process runs
        the job's config, so the readiness wait never takes the forked child for a dead daemon."""
        shost.unit_exec_scans = 3
        SystemdBackend(shost, systemd).start(jd)
        assert verbs(shost) == ["show", "start", "show", "show"]  # two scans found only "(nvidia-imex)"
        assert [p.cmdline for p in shost.processes_with_arg(str(config))] == [
            ("/usr/bin/nvidia-imex", "-c", str(config))
        ]
        assert shost.slept == [0.02, 0.02]

    def test_start_reports_a_daemon_that_died_at_once(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir
    ) -> None:
        """A daemon that exits before it shows up is a DaemonError with what systemd says of the unit."""
        shost.daemon_dies = True
        with pytest.raises(DaemonError, match=rf"{UNIT} exited during start-up \(failed/failed, result exit-code, "):
            SystemdBackend(shost, systemd).start(jd)

    def test_start_gives_up_at_start_timeout(
        self, shost: FakeHost, make_settings: Callable[..., Settings], config: Path, jd: JobDir
    ) -> None:
        """A unit that stays active without ever running the config fails after [daemon] start_timeout_s."""
        shost.unit_exec_scans = 10_000
        settings = make_settings(daemon={"backend": "systemd", "start_timeout_s": 1})
        with pytest.raises(DaemonError, match=rf"{UNIT}: no process runs {config} after systemctl start \(active/"):
            SystemdBackend(shost, settings).start(jd)
        assert 1.0 <= sum(shost.slept) < 1.1

    def test_stop_stops_and_resets_failed(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """stop stops the unit, reads its result, then clears a failed state; a clean stop reports nothing."""
        backend = SystemdBackend(shost, systemd)
        backend.start(jd)
        assert backend.stop(jd) == ""
        assert verbs(shost) == ["show", "start", "stop", "show", "reset-failed"]
        assert shost.units[UNIT]["ActiveState"] == "inactive"

    def test_stop_reports_the_sigkill_after_the_stop_timeout(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir
    ) -> None:
        """A daemon that ignores SIGTERM leaves Result=timeout (systemd's SIGKILL): stop says so."""
        shost.daemon_ignores_sigterm = True
        backend = SystemdBackend(shost, systemd)
        backend.start(jd)
        assert backend.stop(jd) == f"{UNIT}: systemd sent SIGKILL after the stop timeout"
        assert verbs(shost)[-2:] == ["show", "reset-failed"]

    def test_reset_failed_error_is_ignored(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """A failing reset-failed does not fail the stop."""
        shost.fail_verbs.add("reset-failed")
        SystemdBackend(shost, systemd).stop(jd)
        assert verbs(shost) == ["stop", "show", "reset-failed"]

    def test_reset_failed_runs_when_show_fails(
        self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir
    ) -> None:
        """A failing systemctl show after the stop still clears the failed state, then raises."""
        shost.fail_verbs.add("show")
        with pytest.raises(DaemonError, match="systemctl show"):
            SystemdBackend(shost, systemd).stop(jd)
        assert verbs(shost) == ["stop", "show", "reset-failed"]

    def test_info_reports_state_and_pid(self, shost: FakeHost, systemd: Settings, config: Path, jd: JobDir) -> None:
        """info shows ActiveState/SubState and MainPID of the job's unit."""
        backend = SystemdBackend(shost, systemd)
        backend.start(jd)
        info = backend.info(jd)
        assert (info.backend, info.unit, info.state.split("/")[0]) == ("systemd", UNIT, "active")
        assert info.pid == int(shost.units[UNIT]["pid"])

    def test_full_prolog_and_epilog_leave_the_unit_inactive(
        self, shost: FakeHost, systemd: Settings, gpu: FakeGpu, root: Path
    ) -> None:
        """A prolog and epilog with backend=systemd start and stop the job's unit and leave nothing running."""
        rt = Runtime(shost, gpu, systemd, structlog.get_logger())
        prolog(job_env(job_id=42), rt)
        assert shost.units[UNIT]["ActiveState"] == "active"
        epilog(job_env(job_id=42), rt)
        assert shost.units[UNIT]["ActiveState"] == "inactive"
        assert [p for p in shost.procs.values() if p.alive] == []
        assert verbs(shost)[-3:] == ["stop", "show", "reset-failed"]
        assert not (root / "run/imexctl/jobs/42").exists()

    def test_epilog_reports_the_sigkill_after_the_stop_timeout(
        self, shost: FakeHost, systemd: Settings, gpu: FakeGpu, root: Path
    ) -> None:
        """The epilog names systemd's SIGKILL in its actions and logs imex.daemon.killed."""
        rt = Runtime(shost, gpu, systemd, structlog.get_logger())
        prolog(job_env(job_id=42), rt)
        shost.procs[int(shost.units[UNIT]["pid"])].ignores_sigterm = True
        with structlog.testing.capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt)
        assert (
            out.fields()["actions"][0] == f"stop daemon of job 42 ({UNIT}: systemd sent SIGKILL after the stop timeout)"
        )
        killed = [e for e in logs if e["event"] == "imex.daemon.killed"]
        assert killed == [
            {
                "event": "imex.daemon.killed",
                "log_level": "warning",
                "config": str(root / "run/imexctl/jobs/42/config.cfg"),
                "by": f"{UNIT}: systemd sent SIGKILL after the stop timeout",
            }
        ]

    def test_stop_that_fails_still_resets_failed(self, shost: FakeHost, systemd: Settings, jd: JobDir) -> None:
        """systemctl stop fails: reset-failed runs all the same, and the stop's error is raised."""
        shost.fail_verbs.add("stop")
        with pytest.raises(DaemonError, match="systemctl stop"):
            SystemdBackend(shost, systemd).stop(jd)
        assert verbs(shost) == ["stop", "reset-failed"]

    def test_forget_waits_for_systemd_to_see_the_kill(self, shost: FakeHost, systemd: Settings, jd: JobDir) -> None:
        """forget resets until the unit is neither failed nor still going; a unit that never settles is said."""
        backend = SystemdBackend(shost, systemd)
        backend.start(jd)
        (proc,) = shost.procs.values()
        shost.send_signal(proc.info, signal.SIGKILL)
        assert backend.forget(jd) == "" and shost.units[UNIT]["ActiveState"] == "inactive"
        assert verbs(shost)[-2:] == ["reset-failed", "show"] and shost.slept == []
        shost.units[UNIT].update(ActiveState="deactivating", pid="0")
        assert backend.forget(jd) == f"{UNIT} is still deactivating after reset-failed"
        assert 2.0 <= sum(shost.slept) < 2.2  # daemon.FORGET_S

    @pytest.mark.parametrize("how", ["stop-fails", "orphan"])
    def test_a_unit_whose_daemon_imexctl_killed_is_not_left_failed(
        self, shost: FakeHost, systemd: Settings, gpu: FakeGpu, root: Path, how: str
    ) -> None:
        """The daemon ignores SIGTERM and imexctl's teardown has to SIGKILL it, after systemctl stop failed or
        for a daemon whose job directory is gone (cleanup): systemd then marks the unit failed, and a unit left
        failed is what health agents drain a node for: teardown clears it (reset-failed after the kill)."""
        rt = Runtime(shost, gpu, systemd, structlog.get_logger())
        prolog(job_env(job_id=42), rt)
        shost.procs[int(shost.units[UNIT]["pid"])].ignores_sigterm = True
        if how == "stop-fails":
            shost.fail_verbs.add("stop")
            out = epilog(job_env(job_id=42), rt).fields()["actions"][0]
        else:
            remove_tree(root / "run/imexctl/jobs/42")
            out = cleanup(rt).data()["actions"][0]
        assert "SIGKILL to pid" in out, out
        assert [p for p in shost.procs.values() if p.alive] == []
        assert verbs(shost)[-2:] == ["reset-failed", "show"]  # after the kill
        shown = parse_systemctl_show(shost.run(("/usr/bin/systemctl", "show", "--", UNIT), timeout_s=1).stdout)
        assert shown[UNIT]["ActiveState"] == "inactive", shown

    @pytest.mark.parametrize("how", ["crashed", "killed", "start-failed"])
    def test_a_unit_whose_daemon_died_is_not_left_failed(
        self, shost: FakeHost, systemd: Settings, gpu: FakeGpu, how: str
    ) -> None:
        """A daemon that crashed or was SIGKILLed mid-job (its unit failed, Restart=no), or that died during the
        prolog's start (the roll-back): the stop leaves the unit failed, the reset-failed after it does not."""
        rt = Runtime(shost, gpu, systemd, structlog.get_logger())
        if how == "start-failed":
            shost.daemon_dies = True
            with pytest.raises(DaemonError, match="exited during start-up"):
                prolog(job_env(job_id=42), rt)
        else:
            prolog(job_env(job_id=42), rt)
            proc = shost.procs[int(shost.units[UNIT]["pid"])]
            if how == "crashed":
                proc.alive = False
            else:
                shost.send_signal(proc.info, signal.SIGKILL)
            assert SystemdBackend(shost, systemd).info(rt.settings.paths.job(42)).state == "failed/failed"
            epilog(job_env(job_id=42), rt)
        assert verbs(shost)[-3:] == ["stop", "show", "reset-failed"]
        assert shost.units[UNIT]["ActiveState"] == "inactive"


class TestExecBackend:
    @pytest.fixture
    def exec_settings(self, make_settings: Callable[..., Settings]) -> Settings:
        return make_settings(daemon={"backend": "exec"})

    def test_start_spawns_and_records_pid(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """start spawns nvidia-imex -c <config> detached and writes 'pid start_time' next to the config."""
        config.parent.mkdir(parents=True)
        ExecBackend(host, exec_settings).start(jd)
        assert host.calls == [("spawn", "/usr/bin/nvidia-imex", "-c", str(config))]
        (pid,) = host.procs
        assert (config.parent / "daemon.pid").read_text() == f"{pid} {host.procs[pid].info.create_time!r}\n"

    def test_start_stops_the_daemon_when_its_pid_cannot_be_recorded(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The pid file cannot be written: the daemon just spawned is stopped by its pid, and the error goes on."""
        config.parent.mkdir(parents=True)

        def full(path: Path, data: str, *, mode: int = 0o644) -> bool:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        monkeypatch.setattr(daemon_module, "atomic_write", full)
        with pytest.raises(OSError, match="No space left"):
            ExecBackend(host, exec_settings).start(jd)
        (pid,) = host.procs
        assert host.signals == [(pid, signal.SIGTERM)] and not host.procs[pid].alive

    def test_a_start_time_that_is_not_known_is_never_recorded(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """spawn could not tell the daemon's start: no pid file, so when its pid is someone else's later, stop
        signals nobody and info does not take that process for the daemon."""
        config.parent.mkdir(parents=True)
        host.spawn_start_unknown = True
        backend = ExecBackend(host, exec_settings)
        backend.start(jd)
        assert not jd.pid_file.exists()
        (pid,) = host.procs
        host.procs[pid].alive = False
        host.now += 60
        host.procs[pid] = _Proc(ProcInfo(pid, host.now, ("/usr/bin/vim",), uid=1000))  # the pid, reused
        backend.stop(jd)
        assert host.signals == [] and host.procs[pid].alive and backend.info(jd).state == "absent"

    def test_a_pid_file_without_a_start_time_is_not_believed(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """A pid file of an older imexctl that recorded start 0.0: its pid alone is nobody's word."""
        config.parent.mkdir(parents=True)
        other = host.add_process(["/usr/bin/vim"], uid=1000)
        jd.pid_file.write_text(f"{other.pid} 0.0\n")
        backend = ExecBackend(host, exec_settings)
        backend.stop(jd)
        assert host.signals == [] and backend.info(jd).state == "absent"

    def test_info_by_pid_file(self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir) -> None:
        """info reports the recorded daemon as running, then dead once it exited."""
        config.parent.mkdir(parents=True)
        backend = ExecBackend(host, exec_settings)
        backend.start(jd)
        (pid,) = host.procs
        assert (backend.info(jd).state, backend.info(jd).pid) == ("running", pid)
        host.procs[pid].alive = False
        assert backend.info(jd).state == "dead"

    def test_info_without_pid_file(self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir) -> None:
        """Without a pid file and without a process the daemon is absent."""
        assert ExecBackend(host, exec_settings).info(jd).state == "absent"

    def test_stop_sends_sigterm_to_recorded_pid(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """stop sends SIGTERM to the recorded process and it is gone."""
        config.parent.mkdir(parents=True)
        backend = ExecBackend(host, exec_settings)
        backend.start(jd)
        backend.stop(jd)
        (pid,) = host.procs
        assert host.signals == [(pid, signal.SIGTERM)] and not host.procs[pid].alive

    def test_ensure_gone_escalates_to_sigkill(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """A daemon ignoring SIGTERM is killed after kill_grace_s and its pid reported."""
        host.daemon_ignores_sigterm = True
        config.parent.mkdir(parents=True)
        ExecBackend(host, exec_settings).start(jd)
        (pid,) = host.procs
        assert ensure_gone(host, exec_settings, config) == [pid]
        assert host.signals == [(pid, signal.SIGTERM), (pid, signal.SIGKILL)]
        assert sum(host.slept) >= exec_settings.daemon.kill_grace_s
        # checked often at first (a daemon usually exits within milliseconds), then every 50 ms
        assert host.slept[:6] == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05] and max(host.slept) == 0.05

    def test_ensure_gone_raises_for_unkillable(
        self, host: FakeHost, exec_settings: Settings, config: Path, jd: JobDir
    ) -> None:
        """A daemon that survives SIGKILL makes the node unsafe."""
        host.daemon_ignores_sigterm = host.daemon_unkillable = True
        config.parent.mkdir(parents=True)
        ExecBackend(host, exec_settings).start(jd)
        with pytest.raises(UnsafeNodeError, match="survives SIGKILL"):
            ensure_gone(host, exec_settings, config)

    def test_ensure_gone_without_processes_does_nothing(
        self, host: FakeHost, exec_settings: Settings, config: Path
    ) -> None:
        """No daemon of the job means no signal and no wait."""
        assert ensure_gone(host, exec_settings, config) == [] and host.signals == [] and host.slept == []


class TestOrphanedCtl:
    """A prolog killed during a probe leaves ``nvidia-imex-ctl -c <config> -q``: it is not the daemon."""

    @pytest.mark.parametrize(
        "argv",
        [
            ("/usr/bin/nvidia-imex-ctl", "-c", "{config}", "-q"),
            ("/opt/imexctl/bin/python3", "/opt/imexctl/bin/nvidia-imex-ctl-sim", "-c", "{config}", "-N", "-j"),
        ],
    )
    def test_a_ctl_is_no_daemon_but_teardown_ends_it(
        self,
        host: FakeHost,
        make_settings: Callable[..., Settings],
        config: Path,
        tmp_path: Path,
        argv: tuple[str, ...],
    ) -> None:
        s = make_settings()
        ctl = host.spawn_detached([a.format(config=config) for a in argv], log_path=tmp_path / "ctl.log")
        assert job_processes(host, s, config) == []
        assert job_processes(host, s, config, with_clients=True) == [ctl]
        daemon = host.spawn_detached(["/usr/bin/nvidia-imex", "-c", str(config)], log_path=tmp_path / "d.log")
        assert job_processes(host, s, config) == [daemon]
        ensure_gone(host, s, config)
        assert (ctl.pid, signal.SIGTERM) in host.signals and (daemon.pid, signal.SIGTERM) in host.signals
        assert job_processes(host, s, config, with_clients=True) == []
