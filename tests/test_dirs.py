"""State, lock and config directories are root's alone: the hooks refuse any other (issue 10, "Paths and files").

The run directory (``[paths] run_dir``) holds the node lock and every job's
state; the directory of the config file decides what the config says.  A
directory that another uid owns, that group or others may write, or a symlink
where the run directory belongs is refused with the directory named, the
documented exit code, and nothing created in it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import pytest

from imexctl.cli import main
from imexctl.config.settings import Settings
from tests.support.fakes import FakeGpu, FakeHost, job_env
from tests.support.privileges import needs_chown

RULE = "must be owned by root and not writable by group or others"


@pytest.fixture
def cfg(make_settings: Callable[..., Settings]) -> str:
    return str(make_settings().source)


def run(cfg: str, hook: str, host: FakeHost) -> int:
    # cleanup --force: the prolog set the job up and no epilog ran, so plain cleanup would keep it as live
    args = [hook, "--force"] if hook == "cleanup" else [hook]
    return main(["--config", cfg, *args], env=job_env(), host=host, gpu=FakeGpu())


def failure(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """The summary line of the failed run (the last JSON line on stderr)."""
    line: dict[str, object] = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    return line


def spoil(run_dir: Path, how: str) -> Path:
    """Make ``run_dir`` (existing, empty) bad in one way; returns the directory the error must name."""
    if how == "symlink":
        os.rmdir(run_dir)
        elsewhere = run_dir.parent / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        run_dir.symlink_to(elsewhere)
    elif how == "other-uid":
        os.chown(run_dir, 1501, 1501)
    else:
        os.chmod(run_dir, int(how, 8))
    return run_dir


BAD = [
    pytest.param("0777", id="world-writable"),
    pytest.param("0775", id="group-writable"),
    pytest.param("1777", id="sticky-world-writable"),
    pytest.param("other-uid", id="owned-by-another-uid", marks=needs_chown),
    pytest.param("symlink", id="symlink-in-place"),
]


@pytest.mark.parametrize("how", BAD)
def test_prolog_refuses_a_run_directory_that_is_not_roots(
    how: str, cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 71 (file_failed) naming the run directory and what is wrong; no lock, no job directory, no daemon."""
    run_dir = root / "run/imexctl"
    run_dir.mkdir(parents=True, mode=0o755)
    bad = spoil(run_dir, how)
    assert run(cfg, "prolog", host) == 71
    line = failure(capsys)
    assert (line["event"], line["error_code"]) == ("prolog.done", "file_failed")
    reason = str(line["reason"])
    assert f"cannot open the node lock {run_dir}/lock: {bad}: " in reason
    assert ("is a symbolic link" if how == "symlink" else RULE) in reason
    assert os.listdir(run_dir) == []  # through the symlink too: nothing was made where it leads
    assert not any(c[0] == "spawn" for c in host.calls)


def test_prolog_refuses_a_jobs_directory_others_may_write(
    cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Below a good run directory, a world-writable ``jobs`` directory: refused before the job's directory is made."""
    jobs = root / "run/imexctl/jobs"
    jobs.mkdir(parents=True)
    os.chmod(jobs, 0o777)
    assert run(cfg, "prolog", host) == 71
    reason = str(failure(capsys)["reason"])
    assert reason.startswith(f"{jobs}: {RULE} (owner uid {os.geteuid()}, mode 0777)"), reason
    assert os.listdir(jobs) == [] and not any(c[0] == "spawn" for c in host.calls)


@pytest.mark.parametrize("hook", ["epilog", "cleanup"])
def test_epilog_and_cleanup_refuse_too_and_touch_nothing(
    hook: str, cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's leftovers in a run directory that others may write: the epilog and cleanup exit 71 naming it,
    and leave what is there alone (whoever could write there may have planted it)."""
    assert run(cfg, "prolog", host) == 0
    run_dir = root / "run/imexctl"
    os.chmod(run_dir, 0o777)
    before = sorted(p.name for p in (run_dir / "jobs/42").iterdir())
    capsys.readouterr()
    assert run(cfg, hook, host) == 71
    if hook == "epilog":
        assert f"{run_dir}: {RULE}" in str(failure(capsys)["reason"])
    else:  # an admin's command says its failure in one plain line (cli: plain_failure)
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("imexctl cleanup: ") and f"{run_dir}: {RULE}" in err[-1]
        assert err[-1].endswith("(file_failed, exit 71)")
    assert sorted(p.name for p in (run_dir / "jobs/42").iterdir()) == before
    os.chmod(run_dir, 0o755)
    assert run(cfg, hook, host) == 0 and not (run_dir / "jobs/42").exists()


@pytest.mark.parametrize("how", [pytest.param("0777", id="world-writable"), pytest.param("0775", id="group-writable")])
def test_a_config_in_a_directory_others_may_write_exits_78(
    how: str, root: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hooks refuse a config file whose directory others may write (config_invalid, 78): nothing is made."""
    etc = root / "etc"
    etc.mkdir()
    path = etc / "imexctl.conf"
    path.write_text(f"[paths]\nroot = {root}\n[daemon]\nbackend = exec\n")
    os.chmod(path, 0o644)
    os.chmod(etc, int(how, 8))
    assert run(str(path), "prolog", host) == 78
    line = failure(capsys)
    assert line["error_code"] == "config_invalid"
    assert f"config directory {etc} {RULE} (owner uid {os.geteuid()}, mode {how})" in str(line["reason"])
    assert not (root / "run").exists() and host.calls == []
