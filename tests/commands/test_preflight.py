"""imexctl preflight: what the packages ask a version before they switch to it (one line; 0, 78 or 69)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl import __version__, cli
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost

DRIVER = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder)\n"


@pytest.fixture
def tray(root: Path) -> Path:
    """A booted tray (systemd runs it) with the driver 580.95.05 loaded and nvidia-imex installed."""
    (root / "run/systemd/system").mkdir(parents=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(DRIVER)
    imex = root / "usr/bin/nvidia-imex"
    imex.parent.mkdir(parents=True)
    imex.write_text("#!/bin/sh\nexit 0\n")
    imex.chmod(0o755)
    write_config(root, _sections(root))
    return root


def _sections(root: Path) -> dict[str, dict[str, str]]:
    return {"paths": {"root": str(root)}, "commands": {"nvidia_imex": f"{root}/usr/bin/nvidia-imex"}}


def preflight(tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    argv = ["--config", str(tray / "imexctl.conf"), "preflight", *args]
    code = cli.main(argv, env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=FakeGpu())
    out, err = capsys.readouterr()
    return code, out, err


def test_a_good_tray_passes_in_one_line(tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """The config parses and nvidia-imex is the driver's version: exit 0, one line on stdout, nothing on stderr."""
    code, out, err = preflight(tray, host, capsys)
    assert (code, err) == (0, "")
    assert out == (
        f"imexctl {__version__} preflight: {tray}/imexctl.conf parses; nvidia-imex 580.95.05 matches the driver\n"
    )
    assert (f"{tray}/usr/bin/nvidia-imex", "--version") in host.calls


def test_a_configparser_file_is_refused_with_its_line(
    tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """'key: value', which configparser read and this reader does not: exit 78, one line naming the line."""
    conf = tray / "imexctl.conf"
    conf.write_text(conf.read_text() + "[readiness]\ndeadline_s: 90\n")
    code, out, err = preflight(tray, host, capsys)
    assert (code, out) == (78, "")
    assert err.count("\n") == 1 and err.startswith(f"imexctl {__version__} preflight: {conf}: line 6: ")
    assert "'deadline_s: 90'" in err


def test_another_imex_version_is_refused(tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """nvidia-imex of another version than the loaded driver: exit 69, one line with both versions."""
    host.imex_version_output = "IMEX version is: 580.105.08\n"
    code, out, err = preflight(tray, host, capsys)
    assert (code, out) == (69, "")
    assert err == (
        f"imexctl {__version__} preflight: nvidia-imex 580.105.08 but the driver is 580.95.05: "
        "every job's daemon would refuse to start\n"
    )


def test_a_bad_config_is_the_one_problem(tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """A config that does not load: exit 78 for it alone; the daemon is not asked (the config names which one)."""
    host.imex_version_output = "IMEX version is: 570.124.06\n"
    conf = tray / "imexctl.conf"
    conf.write_text(conf.read_text() + "[policy]\nfabric = maybe\n")
    code, _, err = preflight(tray, host, capsys)
    assert code == 78 and err.count("\n") == 1 and "[policy] fabric" in err, err
    assert "570.124.06" not in err and not [c for c in host.calls if c[-1] == "--version"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda t: (t / "run/systemd/system").rmdir(), "systemd does not run this system"),
        (lambda t: (t / "proc/driver/nvidia/version").unlink(), "no NVIDIA driver loaded"),
        (lambda t: (t / "usr/bin/nvidia-imex").unlink(), "nvidia-imex is missing"),
    ],
)
def test_no_judgement_without_both_versions_on_a_booted_tray(
    tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str], change: object, why: str
) -> None:
    """An image being built (no systemd running it), no driver, no nvidia-imex: the versions are not judged."""
    host.imex_version_output = "IMEX version is: 570.124.06\n"
    change(tray)  # type: ignore[operator]
    code, out, err = preflight(tray, host, capsys)
    assert (code, err) == (0, ""), err
    assert "nvidia-imex not judged: " in out and why in out
    assert not [c for c in host.calls if c[-1] == "--version"]


def test_auth_files_the_prolog_refuses_are_refused(
    tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """[auth] enabled with a key file others can read: the prolog's own check, exit 78."""
    key = tray / "etc/imex/server.key"
    key.parent.mkdir(parents=True)
    key.write_text("key\n")
    key.chmod(0o644)
    sections = _sections(tray)
    sections["auth"] = {"enabled": "yes", **{k: str(key) for k in ("server_key", "server_cert", "server_cert_auth")}}
    sections["auth"] |= {k: str(key) for k in ("client_key", "client_cert", "client_cert_auth")}
    write_config(tray, sections)
    code, _, err = preflight(tray, host, capsys)
    assert code == 78 and "[auth] server_key" in err, err


def test_config_only_leaves_the_daemon_alone(tray: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """--config-only (the Ansible role's validate): another daemon version is not asked about, a bad file still is."""
    host.imex_version_output = "IMEX version is: 580.105.08\n"
    code, out, err = preflight(tray, host, capsys, "--config-only")
    assert (code, err) == (0, "") and "nvidia-imex not judged (--config-only)" in out
    assert not [c for c in host.calls if c[-1] == "--version"]
    conf = tray / "imexctl.conf"
    conf.write_text(conf.read_text() + "[readiness]\ndeadline_s: 90\n")
    assert preflight(tray, host, capsys, "--config-only")[0] == 78
