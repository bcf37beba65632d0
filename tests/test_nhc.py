"""pkg/nhc/imexctl.nhc under a harness that calls it as LBNL NHC does (tests/support/nhc_harness.sh).

NHC is not in Debian; the harness follows its driver's calling convention (sourced scripts, eval'd check
lines, ``die``, ``TIMEOUT``, the node marked by an eval with the message in single quotes).  The checks run
the real ``imexctl health --check-only`` on a tray under a temporary root where they can, and a stand-in
where a fault cannot be made without a GPU (a hang, an unexpected exit).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_config

REPO = Path(__file__).resolve().parent.parent
NHC_FILE = REPO / "pkg/nhc/imexctl.nhc"
HARNESS = REPO / "tests/support/nhc_harness.sh"
BOOT = "7e0493b2-61b7-4448-b8c3-88f6a56ee7c9"
#: the driver's own record (facility 0, printk's default level 4) as the kernel keeps it
DRIVER_LINE = (
    4,
    "NVRM: imexsessionapiDestruct_IMPL: Abrupt nvidia-imex daemon shutdown detected, disabled fabric allocations",
)

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not Path("/usr/bin/timeout").exists(), reason="bash")


def _nhc(tmp: Path, conf: str, command: Path, **env: str) -> subprocess.CompletedProcess[str]:
    confdir = tmp / "nhc"
    (confdir / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(NHC_FILE, confdir / "scripts/imexctl.nhc")
    (confdir / "nhc.conf").write_text(f"# site checks\n{conf}\n")
    assignments = [f"{k}={v}" for k, v in {"HOSTNAME": "gb01", "IMEXCTL_HEALTH_CMD": str(command), **env}.items()]
    return subprocess.run(
        ["/bin/bash", str(HARNESS), str(confdir), *assignments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gb01"},
    )


def _imexctl(tmp: Path, root: Path) -> Path:
    """The real imexctl of this checkout, with the tray's config (what /usr/sbin/imexctl is on a node)."""
    main = f"import sys; sys.path.insert(0, {str(REPO)!r}); from imexctl.cli import console; console()"
    script = tmp / "imexctl"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -c "{main}" --config {root}/imexctl.conf "$@"\n')
    script.chmod(0o755)
    return script


def _stub(tmp: Path, body: str) -> Path:
    script = tmp / "stub-imexctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _tray(root: Path, *kernel: str | tuple[int, str]) -> None:
    """A tray under ``root`` whose kernel log holds ``kernel``: each a line (PRIO 6) or ``(PRIO, line)``."""
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (root / "dev").mkdir()
    records = [(6, k) if isinstance(k, str) else k for k in kernel]
    (root / "dev/kmsg").write_text("".join(f"{prio},{i},{i},-;{line}\n" for i, (prio, line) in enumerate(records)))
    write_config(root, {"paths": {"root": str(root)}, "daemon": {"backend": "exec"}, "policy": {"fabric": "none"}})


@pytest.mark.skipif(os.geteuid() != 0, reason="imexctl health judges the jobs and the kernel log as root")
def test_a_healthy_tray_passes_and_nhc_marks_it_online(root: Path, tmp_path: Path) -> None:
    _tray(root, "Linux version 6.1.0")
    done = _nhc(tmp_path, "* || check_imexctl_health", _imexctl(tmp_path, root))
    assert (done.returncode, done.stdout.strip()) == (0, "online gb01"), done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="imexctl health judges the jobs and the kernel log as root")
def test_the_first_finding_is_the_nhc_message_with_quotes_made_safe(root: Path, tmp_path: Path) -> None:
    """The kernel's line comes back between single quotes, which NHC's eval would break on: they become blanks,
    the code comes first, the node is named."""
    _tray(root, "Linux version 6.1.0", DRIVER_LINE)
    done = _nhc(tmp_path, "gb* || check_imexctl_health", _imexctl(tmp_path, root))
    assert done.returncode == 1, done.stderr
    offline = done.stdout.splitlines()[-1]
    assert offline.startswith("offline gb01 NHC: imexn:imex_shutdown gb01: kernel:  Abrupt nvidia-imex daemon")
    assert "'" not in offline and len(offline) <= len("offline gb01 NHC: ") + 200


@pytest.mark.skipif(os.geteuid() != 0, reason="imexctl health judges the jobs and the kernel log as root")
def test_a_forged_kernel_line_does_not_offline_the_node(root: Path, tmp_path: Path) -> None:
    """A user's mount option echoed by the kernel, and the driver's exact words written by user space (LOG_USER,
    PRIO 11): neither is the driver's record, the node stays online (issue 41: NHC offlined it)."""
    _tray(
        root,
        "Linux version 6.1.0",
        (3, "tmpfs: Unknown parameter 'Abrupt nvidia-imex daemon shutdown detected'"),
        (11, DRIVER_LINE[1]),
    )
    done = _nhc(tmp_path, "* || check_imexctl_health", _imexctl(tmp_path, root))
    assert (done.returncode, done.stdout.strip()) == (0, "online gb01"), done.stdout + done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="imexctl health judges the jobs and the kernel log as root")
def test_the_drivers_line_stays_reported_until_an_admin_acknowledges_it(root: Path, tmp_path: Path) -> None:
    """NHC runs the check again and again: the node stays offline for imex_shutdown (before, the second run found
    nothing and NHC put the node back by itself) until an admin runs imexctl health --acknowledge on the tray."""
    _tray(root, "Linux version 6.1.0", DRIVER_LINE)
    imexctl = _imexctl(tmp_path, root)
    for _ in range(2):
        done = _nhc(tmp_path, "* || check_imexctl_health", imexctl)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1].startswith("offline gb01 NHC: imexn:imex_shutdown gb01: kernel: ")
    ack = subprocess.run(
        [str(imexctl), "health", "--acknowledge", "--node", "gb01"], capture_output=True, text=True, timeout=60
    )
    assert ack.returncode == 0 and "acknowledged gb01: imex_shutdown: kernel: " in ack.stdout, ack.stdout + ack.stderr
    done = _nhc(tmp_path, "* || check_imexctl_health", imexctl)
    assert (done.returncode, done.stdout.strip()) == (0, "online gb01"), done.stdout + done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="imexctl health judges the jobs and the kernel log as root")
def test_a_config_that_does_not_load(root: Path, tmp_path: Path) -> None:
    _tray(root)
    (root / "imexctl.conf").write_text("[readiness]\ndeadline_s = soon\n")
    done = _nhc(tmp_path, "* || check_imexctl_health", _imexctl(tmp_path, root))
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].startswith("offline gb01 NHC: imexn:config_invalid gb01: ")


def test_a_hang_ends_at_the_checks_limit_not_nhcs(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _nhc(tmp_path, "* || check_imexctl_health -t 1", _stub(tmp_path, "exec sleep 60"))
    # the check's 1 s limit ended it (the line below says so), not NHC's TIMEOUT (30 s) nor the stub's 60 s: the
    # rest of the 20 s is a loaded machine's margin
    assert time.monotonic() - started < 20
    assert (
        done.stdout.splitlines()[-1] == "offline gb01 NHC: imexn:timeout gb01: no verdict from imexctl health within 1s"
    )


@pytest.mark.parametrize("limit", ["30", "45"])
def test_a_limit_at_or_above_nhcs_timeout_is_refused(tmp_path: Path, limit: str) -> None:
    """As NHC's own check_cmd_status refuses a -t above TIMEOUT, so that NHC's watchdog never cuts a check short."""
    done = _nhc(tmp_path, f"* || check_imexctl_health -t {limit}", _stub(tmp_path, "exit 0"))
    assert done.stdout.splitlines()[-1] == (
        f"offline gb01 NHC: check_imexctl_health:  Command timeout {limit} is not below NHC timeout 30"
    )
    assert _nhc(tmp_path, "* || check_imexctl_health -t 45", _stub(tmp_path, "exit 0"), TIMEOUT="60").returncode == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("exit 69", "imexn:exit_69 gb01: imexctl health --check-only exited 69"),
        ("echo 'Traceback (most recent call last):'; exit 1", "imexn:unknown gb01: exit 1 without a verdict"),
        (
            'echo "unhealthy gb01: stale_daemon: it\'s pid 7 \\$(reboot) \\`id\\`"; exit 1',
            "imexn:stale_daemon gb01: it s pid 7  (reboot)  id ",
        ),
    ],
)
def test_anything_else_fails_with_a_safe_message(tmp_path: Path, body: str, message: str) -> None:
    done = _nhc(tmp_path, "* || check_imexctl_health", _stub(tmp_path, body))
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == f"offline gb01 NHC: {message}"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("exec sleep 60", "timeout"),
        ("exit 69", "exit_69"),
        ("exit 1", "unknown"),
        ('echo "unhealthy gb01: gpu_failed: NVML: x"; exit 1', "gpu_failed"),
    ],
)
def test_every_message_is_ncs_own_reason_of_ours(tmp_path: Path, body: str, code: str) -> None:
    """Each way the check fails leaves 'NHC: ' and then a reason of the NHC check's own prefix, naming the node:
    regex tools classify it, and imexctl health never takes it for its own (it resumes only imexh:)."""
    from imexctl.slurm import drain

    done = _nhc(tmp_path, "* || check_imexctl_health -t 1", _stub(tmp_path, body))
    reason = done.stdout.splitlines()[-1].removeprefix("offline gb01 ")
    ours = drain.parse(reason)
    assert reason.startswith("NHC: imexn:") and ours is not None, reason
    assert (ours.owner, ours.code, ours.node) == ("nhc", code, "gb01")
    assert drain.parse(reason, (drain.HEALTH, drain.LEGACY_HEALTH)) is None


def test_imexctl_missing(tmp_path: Path) -> None:
    done = _nhc(tmp_path, "* || check_imexctl_health", tmp_path / "nope")
    assert done.stdout.splitlines()[-1] == f"offline gb01 NHC: check_imexctl_health:  {tmp_path}/nope is not installed"


def test_the_check_asks_health_to_judge_only(tmp_path: Path) -> None:
    """NHC drains and resumes the node itself: the check never lets imexctl change Slurm."""
    args = tmp_path / "args"
    done = _nhc(tmp_path, "* || check_imexctl_health", _stub(tmp_path, f'echo "$@" > {args}; exit 0'))
    assert done.returncode == 0 and args.read_text() == "health --check-only\n"
