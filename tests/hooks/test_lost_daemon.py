"""A daemon lost mid-job is reported by the epilog, counted, and with ``lost_daemon = drain`` drains the tray (issue 22)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.hooks import metrics
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import epilog
from imexctl.imex.daemon import how_ended
from imexctl.platform.errors import DaemonLostError
from tests.support.fakes import FakeGpu, FakeHost, job_env


def _rt(make_settings: Callable[..., Settings], host: FakeHost, **sections: dict[str, Any]) -> Runtime:
    return Runtime(host, FakeGpu(), make_settings(**sections), structlog.get_logger())


def _kill_daemon(host: FakeHost) -> None:
    for p in host.procs.values():
        p.alive = False


def _lost(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "imex.daemon.lost"]


class TestEpilog:
    def test_a_dead_daemon_is_reported_and_the_epilog_exits_0(
        self, make_settings: Callable[..., Settings], host: FakeHost, root: Path
    ) -> None:
        """exec backend: the daemon died mid-job; the epilog warns 'not running', cleans up and succeeds."""
        rt = _rt(make_settings, host)
        prolog(job_env(job_id=42), rt)
        _kill_daemon(host)
        with capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt)
        (event,) = _lost(logs)
        assert event["log_level"] == "warning" and event["domain_job_id"] == 42 and event["how"] == "not running"
        assert out.ok and out.lost_daemon == ("the IMEX daemon of job 42 ended before the job: not running",)
        assert not (root / "run/imexctl/jobs/42").exists()

    def test_a_running_daemon_is_no_loss(self, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """The ordinary epilog stops a live daemon and reports nothing lost."""
        rt = _rt(make_settings, host)
        prolog(job_env(job_id=42), rt)
        with capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt)
        assert _lost(logs) == [] and "lost_daemon" not in out.fields()

    def test_a_prolog_that_failed_is_no_loss(self, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """A job whose prolog never finished setting up had no daemon to lose (no set_up in state.json)."""
        rt = _rt(make_settings, host)
        jd = rt.settings.paths.job(42)
        jd.path.mkdir(parents=True)
        jd.state.write_text(
            '{"job_id": 42, "node": "gb01", "uid": 1, "gid": 1, "user": "u", "nodes": ["gb01"], "addresses": [],'
            ' "port": 61042, "backend": "exec", "channel_minor": null, "channel_path": "", "created": 0.0}'
        )
        with capture_logs() as logs:
            epilog(job_env(job_id=42), rt)
        assert _lost(logs) == []

    def test_systemd_names_the_signal(self, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """systemd backend: the unit's ExecMainCode/Status say the daemon was killed by SIGKILL."""
        rt = _rt(make_settings, host, daemon={"backend": "systemd"})
        host.unit_exec = f"/usr/bin/nvidia-imex -c {rt.settings.paths.jobs_dir}/{{job}}/config.cfg"
        prolog(job_env(job_id=42), rt)
        _kill_daemon(host)
        host.units["imexctl-imex@42.service"].update(
            ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2", ExecMainStatus="9"
        )
        with capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt)
        assert _lost(logs)[0]["how"] == "killed by signal 9 (SIGKILL)" and out.ok

    def test_drain_fails_the_epilog_after_the_teardown(
        self, make_settings: Callable[..., Settings], host: FakeHost, root: Path
    ) -> None:
        """lost_daemon = drain: the tray is cleaned up, then the epilog fails with daemon_lost (exit 69)."""
        rt = _rt(make_settings, host, policy={"lost_daemon": "drain"})
        prolog(job_env(job_id=42), rt)
        _kill_daemon(host)
        with pytest.raises(DaemonLostError, match="job 42 ended before the job: not running.*lost_daemon = drain"):
            epilog(job_env(job_id=42), rt)
        assert not (root / "run/imexctl/jobs/42").exists()
        assert DaemonLostError.exit_code == 69

    def test_drain_leaves_a_healthy_job_alone(self, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """lost_daemon = drain changes nothing for a job whose daemon ran until its epilog."""
        rt = _rt(make_settings, host, policy={"lost_daemon": "drain"})
        prolog(job_env(job_id=42), rt)
        assert epilog(job_env(job_id=42), rt).ok


@pytest.mark.parametrize(
    ("props", "how"),
    [
        pytest.param({"ExecMainCode": "1", "ExecMainStatus": "1"}, "exited with status 1", id="exit-1"),
        pytest.param({"ExecMainCode": "2", "ExecMainStatus": "15"}, "killed by signal 15 (SIGTERM)", id="sigterm"),
        pytest.param({"ExecMainCode": "3", "ExecMainStatus": "6"}, "dumped core by signal 6 (SIGABRT)", id="core"),
        pytest.param({"ExecMainCode": "2", "ExecMainStatus": "99"}, "killed by signal 99", id="unknown-signal"),
        pytest.param({"ExecMainCode": "0", "Result": "resources"}, "unit result resources", id="result"),
        pytest.param({"ExecMainCode": "0", "Result": "success"}, "", id="unknown"),
    ],
)
def test_how_ended(props: dict[str, str], how: str) -> None:
    """systemd's ExecMainCode (CLD_EXITED/KILLED/DUMPED) and ExecMainStatus become one phrase."""
    assert how_ended(props) == how


def test_metrics_count_lost_daemons(make_settings: Callable[..., Settings], host: FakeHost, root: Path) -> None:
    """imexctl_daemon_lost_total counts each epilog that found its daemon gone, with warn and with drain."""
    (root / "var/lib/prom").mkdir(parents=True)
    for policy, code in (("warn", 0), ("drain", 69)):
        cfg = str(make_settings(metrics={"textfile_dir": "/var/lib/prom"}, policy={"lost_daemon": policy}).source)
        assert main(["--config", cfg, "prolog"], env=job_env(job_id=42), host=host, gpu=FakeGpu()) == 0
        _kill_daemon(host)
        assert main(["--config", cfg, "epilog"], env=job_env(job_id=42), host=host, gpu=FakeGpu()) == code
    text = (root / "var/lib/prom" / metrics.FILE_NAME).read_text()
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "imexctl_daemon_lost"]
    assert [s.value for s in fam.samples] == [2]
    assert (
        'imexctl_hook_runs_total{block="nvl-11111111-7",hook="epilog",outcome="failed",error_code="daemon_lost"} 1'
        in text
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog needs root (device nodes, chown)")
def test_a_killed_simulated_daemon_is_reported_then_drains(tmp_path: Path) -> None:
    """Real processes: SIGKILL the simulator's daemon mid-job; the epilog warns (0), and with drain fails (69)."""
    from imexctl.commands.demo import SimRack
    from tests.support.racks import sim_racks

    with sim_racks(SimRack, "imxl") as make:
        rack = make(1)
        t = rack.trays[0]
        for job, policy, code in ((530, "warn", 0), (531, "drain", 69)):
            t.config.write_text(t.config.read_text().replace("[policy]\n", f"[policy]\nlost_daemon = {policy}\n"))
            assert rack.run_hooks("prolog", job)[0].returncode == 0
            pid = int((t.root / f"run/imexctl/jobs/{job}/daemon.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
            result = rack.run_hooks("epilog", job)[0]
            assert result.returncode == code, result.output
            lost = [
                json.loads(x) for x in (t.root / "var/log/imexctl.log").read_text().splitlines() if "daemon.lost" in x
            ]
            assert lost[-1]["job_id"] == job and lost[-1]["how"] == "not running"
            assert rack.leftovers() == []
            t.config.write_text(t.config.read_text().replace(f"lost_daemon = {policy}\n", ""))
