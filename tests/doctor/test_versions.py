"""``imexctl doctor``'s ``imexctl.version``: the package's version in use, and an installed one that is not.

The tray's ``/opt/imexctl`` is laid out under ``[paths] root`` as pkg/imexctl-switch leaves it
(tests/platform/test_versions.py has the reader's cases).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.doctor import checks
from imexctl.doctor import run as doctor_run
from imexctl.doctor.framework import FAIL, OK, Context
from imexctl.hooks.runtime import Runtime
from imexctl.platform import versions
from tests.platform.test_versions import NEW, OLD, REASON, refuse, tray
from tests.support.fakes import FakeGpu, FakeHost, job_env


def version_check(rt: Runtime) -> list[tuple[str, str, str]]:
    return [(c.status, c.message, c.fix) for c in checks.version_checks(Context(rt, {}, "gb01"))]


@pytest.fixture
def top(root: Path) -> Path:
    return root / "opt/imexctl"


def test_a_refused_switch_fails_naming_both_versions_why_and_how_to_finish(rt: Runtime, top: Path) -> None:
    """The new version installed, refused for the config: FAIL with the version in use, the installed one, when,
    why and the switch's words; the fix runs the switch again."""
    tray(top, OLD, NEW)
    refuse(top, NEW)
    ((status, message, fix),) = version_check(rt)
    assert status == FAIL
    assert message.startswith(f"{NEW} is installed but not in use: its switch was refused 2025-12-02 12:00 UTC, ")
    assert f"{versions.WHYS['config']} ({REASON}); the hooks run {OLD}" in message
    assert fix.startswith(f"fix what it names, then run {versions.SWITCH}")


def test_once_switched_it_is_ok(rt: Runtime, top: Path) -> None:
    """After the switch (the link on the installed version, the record gone) the check is OK and names it."""
    tray(top, NEW, NEW)
    assert version_check(rt) == [(OK, f"{NEW} installed and in use ({top}/current)", "")]


def test_a_switch_that_never_ran_and_no_version_in_use_fail(rt: Runtime, top: Path) -> None:
    """Installed but never switched to (no record): FAIL, run the switch; no version in use at all: FAIL."""
    tray(top, OLD, NEW)
    ((status, message, fix),) = version_check(rt)
    assert (status, fix) == (FAIL, f"run {versions.SWITCH}")
    assert f"{NEW} is installed but not in use: {versions.WHYS['not_switched']}; the hooks run {OLD}" == message
    (top / "current").unlink()
    ((status, message, fix),) = version_check(rt)
    assert status == FAIL and message.startswith("no version in use: ") and fix == f"run {versions.SWITCH}"


def test_a_tray_without_the_packages_is_ok(rt: Runtime) -> None:
    """A virtual environment (no /opt/imexctl versions): OK, saying where imexctl runs from."""
    ((status, message, _),) = version_check(rt)
    assert status == OK and "no package's versions in" in message


def test_doctor_reports_it_first_and_fails(
    make_settings: Callable[..., Settings], top: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """``imexctl doctor --json`` on a tray whose upgrade was refused: exit 1, imexctl.version first, FAIL."""
    tray(top, OLD, NEW)
    refuse(top, NEW)
    cfg = make_settings().source
    assert main(["--config", str(cfg), "doctor", "--json"], env=job_env(), host=host, gpu=FakeGpu()) == 1
    data = json.loads(capsys.readouterr().out)
    first = data["data"][0]
    assert (first["name"], first["status"]) == ("imexctl.version", FAIL) and NEW in first["message"]
    assert "imexctl.version" in data["errors"][0]["message"]
    assert doctor_run.CHECK_NAMES[0] == "imexctl.version"
