"""imexctl doctor: the log's and the metrics' directories, judged by who may replace the files in them (issue 41).

The hooks accept a log or metrics directory that its group may write (Ubuntu's
``/var/log`` is ``root:syslog 0775``); a member of that group can then rename
a file of their own over ``imexctl.log`` (the hooks log to stderr only, and
``imexctl why`` leaves it out) or over ``imexctl.prom`` (node_exporter serves
their numbers).  Doctor says so, with a fix.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config import settings
from imexctl.doctor import checks
from imexctl.doctor import framework as doctor
from imexctl.doctor import run as doctor_run
from imexctl.hooks.runtime import Runtime
from tests.support.fakes import FakeGpu, FakeHost

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes directories of root's and another group's")

#: a group that is not root's (nogroup on Debian)
GROUP = 65534


@pytest.fixture
def check(
    host: FakeHost, gpu: FakeGpu, make_settings: Callable[..., settings.Settings]
) -> Callable[..., dict[str, doctor.Check]]:
    """The two checks for a tray whose ``[metrics] textfile_dir`` is ``/metrics`` (or as given), by name."""

    def run(**sections: dict[str, Any]) -> dict[str, doctor.Check]:
        base: dict[str, dict[str, Any]] = {"metrics": {"textfile_dir": "/metrics"}}
        for name, kv in sections.items():
            base.setdefault(name, {}).update(kv)
        rt = Runtime(host, gpu, make_settings(**base), structlog.get_logger())
        found = checks.writable_dir_checks(doctor.Context(rt, {}, "gb01"))
        assert [c.name for c in found] == ["imexctl.log_dir", "imexctl.metrics_dir"]
        return {c.name: c for c in found}

    return run


def _dir(path: Path, mode: int, gid: int = 0, uid: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def _group() -> str:
    try:
        return grp.getgrgid(GROUP).gr_name
    except KeyError:
        return str(GROUP)


def test_directories_of_roots_alone_are_ok(root: Path, check: Any) -> None:
    """root:root 0755 for both: OK, saying so."""
    _dir(root / "var/log", 0o755)
    _dir(root / "metrics", 0o755)
    found = check()
    assert {c.status for c in found.values()} == {doctor.OK}, found
    only = "root's, mode 0755: only root can replace"
    assert found["imexctl.log_dir"].message == f"/var/log: {only} imexctl.log there"
    assert found["imexctl.metrics_dir"].message == f"/metrics: {only} imexctl.prom there"


def test_a_log_directory_its_group_may_write_warns(root: Path, check: Any) -> None:
    """Ubuntu's /var/log (root:syslog 0775): WARN naming the group; the fix moves the log to a directory of root's."""
    _dir(root / "var/log", 0o775, GROUP)
    _dir(root / "metrics", 0o755)
    found = check()
    log = found["imexctl.log_dir"]
    assert log.status == doctor.WARN and found["imexctl.metrics_dir"].status == doctor.OK
    assert log.message.startswith(f"/var/log: group {_group()} may write it (mode 0775): a member can replace ")
    assert "imexctl.log with a file of their own" in log.message and "imexctl why leaves it out" in log.message
    assert "[paths] log_file = /var/log/imexctl/imexctl.log" in log.fix and "logrotate" in log.fix


def test_a_metrics_directory_its_group_may_write_warns(root: Path, check: Any) -> None:
    """A textfile_dir its group may write: WARN, node_exporter would serve a member's numbers."""
    _dir(root / "metrics", 0o2775, GROUP)
    found = check()
    metrics = found["imexctl.metrics_dir"]
    assert metrics.status == doctor.WARN and found["imexctl.log_dir"].status == doctor.OK
    assert metrics.message.startswith(f"/metrics: group {_group()} may write it (mode 2775): a member can replace ")
    assert "imexctl.prom" in metrics.message and "node_exporter" in metrics.message
    assert "chmod g-w /metrics" in metrics.fix


@pytest.mark.parametrize(("mode", "uid"), [(0o1777, 0), (0o755, 65534)])
def test_a_directory_the_hooks_refuse_warns_that_nothing_is_written(
    root: Path, check: Any, mode: int, uid: int
) -> None:
    """Others may write it, or it is not root's: the hooks write no log and no metrics there at all."""
    _dir(root / "var/log", mode, uid=uid)
    _dir(root / "metrics", mode, uid=uid)
    found = check()
    assert {c.status for c in found.values()} == {doctor.WARN}
    assert "the hooks refuse it: they write no log file there (stderr only)" in found["imexctl.log_dir"].message
    assert "the hooks refuse it: every metrics write fails (metrics.failed)" in found["imexctl.metrics_dir"].message
    assert f"owner uid {uid}, mode {mode:04o}" in found["imexctl.log_dir"].message


def test_a_log_file_that_is_not_roots_warns(root: Path, check: Any) -> None:
    """A file of another owner at the log's name (in a directory of root's): the hooks refuse it, why leaves it out."""
    _dir(root / "var/log", 0o755)
    _dir(root / "metrics", 0o755)
    (root / "var/log/imexctl.log").write_text("")
    os.chown(root / "var/log/imexctl.log", 65534, 65534)
    log = check()["imexctl.log_dir"]
    assert log.status == doctor.WARN
    assert "/var/log/imexctl.log is not root's record (owner uid 65534, mode 0644)" in log.message
    assert "remove /var/log/imexctl.log" in log.fix


def test_absent_or_off(root: Path, check: Any) -> None:
    """No log directory yet (the hooks create it root's): OK; metrics off: OK; a textfile_dir missing: WARN."""
    found = check(metrics={"textfile_dir": ""})
    assert found["imexctl.log_dir"].status == doctor.OK and "absent" in found["imexctl.log_dir"].message
    assert found["imexctl.metrics_dir"].status == doctor.OK
    assert found["imexctl.metrics_dir"].message == "[metrics] textfile_dir is empty: no metrics"
    found = check(paths={"log_file": ""})
    assert found["imexctl.log_dir"].message == "[paths] log_file is empty: no log file"
    metrics = found["imexctl.metrics_dir"]
    assert metrics.status == doctor.WARN and "/metrics does not exist" in metrics.message


def test_doctor_runs_them_after_the_logs_check(check: Any, host: FakeHost, gpu: FakeGpu, make_settings: Any) -> None:
    """Both are in the catalogue, right after imexctl.logs, and doctor reports them."""
    names = list(doctor_run.CHECK_NAMES)
    assert names[names.index("imexctl.logs") + 1 : names.index("imexctl.logs") + 3] == [
        "imexctl.log_dir",
        "imexctl.metrics_dir",
    ]
    rt = Runtime(host, gpu, make_settings(), structlog.get_logger())
    reported = [c.name for c in doctor_run.run(doctor.Context(rt, {}, "gb01"))]
    assert {"imexctl.log_dir", "imexctl.metrics_dir"} <= set(reported)
