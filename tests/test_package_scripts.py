"""The packages' shell scripts (the version switch, the interpreter wrapper, the Debian maintainer scripts) pass
shellcheck, and the switch's syslog line is JSON; tests/test_packaging.py runs them in a clean Debian root (marker
packaging), tests/upgrades/test_upgrade_booted.py on a booted node (marker systemd)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = (
    "pkg/imexctl-switch",
    "pkg/python3-wrapper",
    "debian/imexctl.postinst",
    "debian/imexctl.prerm",
    "debian/imexctl.postrm",
)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("name", SCRIPTS)
def test_shellcheck_is_clean(name: str) -> None:
    """shellcheck (as POSIX sh) finds nothing in the script."""
    done = subprocess.run(
        ["shellcheck", "--shell=sh", str(REPO / name)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _switch_functions() -> str:
    """The switch's shell functions that make its syslog line (pkg/imexctl-switch), cut out of the script."""
    text = (REPO / "pkg/imexctl-switch").read_text()
    out = []
    for name in ("json_text", "log"):
        start = text.index(f"\n{name}() {{\n") + 1
        out.append(text[start : text.index("\n}\n", start) + 3])
    return "".join(out)


def test_the_switchs_log_line_is_one_json_object_whatever_the_reason(tmp_path: Path) -> None:
    """package.switch_refused goes to syslog as imexctl's own lines do: one JSON object, with a reason holding
    quotes, backslashes, a tab and a line break kept as text (a stand-in logger records what it was given)."""
    logger = tmp_path / "logger"
    logger.write_text('#!/bin/sh\nprintf "%s\\n" "$*" >>"$0.args"\n')
    logger.chmod(0o755)
    reason = "/etc/imexctl/imexctl.conf: line 3: 'a: b' \"q\" \\x\tand\nmore"
    script = _switch_functions() + 'log warning package.switch_refused version 0.1.0-3 reason "$1"\n'
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    subprocess.run(["sh", "-c", script, "sh", reason], env=env, check=True, timeout=60)
    (args,) = (tmp_path / "logger.args").read_text().splitlines()
    head = "-t imexctl -p daemon.warning -- "
    assert args.startswith(head), args
    line = json.loads(args.removeprefix(head))
    assert line["event"] == "package.switch_refused" and line["level"] == "warning" and line["hook"] == "switch"
    assert line["version"] == "0.1.0-3" and line["reason"] == reason.replace("\t", " ").replace("\n", " ")
