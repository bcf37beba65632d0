"""What DCGM's IMEX health reads on a tray with imexctl: the simulated ctl at the default path, read DCGM's way.

DCGM runs ``nvidia-imex-ctl -N -j`` and ``-q`` without ``-c`` (tests/support/dcgm.py says where that is
written), so against ``/etc/nvidia-imex/config.cfg``.  The simulated ctl is run the same way, with nothing
but the default path: in a private mount namespace whose ``/etc`` is an overlay holding the IMEX package's
config (and, where the case says so, a nodes file), so the machine's own ``/etc`` is never touched.  Doctor
(``imex.dcgm``) is asked about the same files under a tray root, and must say what DCGM reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from imexctl.doctor import framework as doctor
from imexctl.doctor import run as doctor_run
from imexctl.hooks.runtime import Runtime
from tests.support import dcgm
from tests.support.ci import unavailable
from tests.support.fakes import FakeGpu, FakeHost

REPO = Path(__file__).resolve().parents[2]
#: the IMEX package's config.cfg, as far as the ctl reads it (design.md source imex-config: the shipped defaults)
STOCK_CONFIG = """\
# /etc/nvidia-imex/config.cfg as the nvidia-imex package installs it (the keys the ctl reads)
LOG_LEVEL=4
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
IMEX_WAIT_FOR_QUORUM=RECOVERY
IMEX_CMD_PORT=50005
IMEX_CMD_ENABLED=1
"""


# ---------------------------------------------------------------- the model, against DCGM's own tests


@pytest.mark.parametrize(
    ("domain_run", "daemon_run", "domain", "daemon"),
    [
        # dcgmlib/src/tests/DcgmImexManagerTests.cpp, the mocked RunCmdHelper's (result, output) pairs
        ((None, ""), (0, "READY"), "UNAVAILABLE", 5),  # -N -j times out
        ((0, '{"nodes":{},"timestamp":"test","status":"UP"}'), (None, ""), "UP", -3),  # -q times out
        ((0, '{"nodes":{"0":{"status":"READY"}},"timestamp":"test","status":"UP"}'), (0, "READY"), "UP", 5),
        (
            (
                0,
                '{"nodes":{"0":{"status":"READY"},"1":{"status":"UNAVAILABLE"}},"timestamp":"test","status":"DEGRADED"}',
            ),
            (0, "WAITING_FOR_PEERS"),
            "DEGRADED",
            2,
        ),
        ((1, ""), (0, "READY"), "UNAVAILABLE", 5),  # DCGM_ST_INIT_ERROR
        (
            (0, "Failed to read node configuration file"),
            (0, "Failed to read node configuration file"),
            "NOT_CONFIGURED",
            -2,
        ),
    ],
)
def test_the_model_reads_dcgms_own_cases_as_dcgm_does(
    domain_run: tuple[int | None, str], daemon_run: tuple[int | None, str], domain: str, daemon: int
) -> None:
    reading = dcgm.read(domain_run, daemon_run)
    assert (reading.domain, reading.daemon) == (domain, daemon)


# ---------------------------------------------------------------- the ctl at the default path


def _ctl_at_default_path(upper: Path, *args: str) -> tuple[int, str]:
    """``nvidia-imex-ctl ARGS`` (the simulator) with no ``-c``, where /etc is the overlay of ``upper``."""
    work = upper.parent / "work"
    work.mkdir(exist_ok=True)
    script = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
    argv = ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
    argv += [str(upper), str(work), sys.executable, "-m", "imexctl.sim.ctl", *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env={"PYTHONPATH": str(REPO)}, cwd="/"
    )
    if "overlay" in done.stderr and done.returncode != 0 and not done.stdout:
        unavailable(f"no overlay mount here: {done.stderr.strip()}")
    return done.returncode, done.stdout


needs_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(),
    reason="needs root: a private mount namespace with an overlay over /etc",
)


def _files(base: Path, nodes: str | None) -> None:
    """The IMEX package's files under ``base``/nvidia-imex (the overlay's upper layer, or a tray's /etc)."""
    (base / "nvidia-imex").mkdir(parents=True, exist_ok=True)
    (base / "nvidia-imex/config.cfg").write_text(STOCK_CONFIG)
    if nodes is not None:
        (base / "nvidia-imex/nodes_config.cfg").write_text(nodes)


def _doctor(root: Path, make_settings: Any) -> doctor.Check:
    rt = Runtime(FakeHost(), FakeGpu(), make_settings(), structlog.get_logger())
    return {c.name: c for c in doctor_run.run(doctor.Context(rt, {}, "gb01"))}["imex.dcgm"]


@needs_namespace
def test_idle_tray_with_imexctl(tmp_path: Path, root: Path, make_settings: Any) -> None:
    """No readable default nodes file (imexctl writes each job's own elsewhere): the ctl exits 255 with the
    line DCGM looks for, and DCGM, which judges the exit first, reads the domain UNAVAILABLE (passes) and the
    daemon -3 (incident 122): NOT_CONFIGURED is out of reach of a ctl that exits 255.  Doctor is OK and says so."""
    upper = tmp_path / "upper"
    _files(upper, None)
    domain_run = _ctl_at_default_path(upper, "-N", "-j")
    daemon_run = _ctl_at_default_path(upper, "-q")
    for rc, out in (domain_run, daemon_run):
        assert rc == 255 and out.startswith("Failed to read node configuration file /etc/nvidia-imex/nodes_config.cfg")
    reading = dcgm.read(domain_run, daemon_run)
    assert reading == ("UNAVAILABLE", -3, ("DCGM_FR_IMEX_UNHEALTHY: IMEX daemon status is -3 (not READY)",))
    assert dcgm.read((0, domain_run[1]), (0, daemon_run[1]))[:2] == ("NOT_CONFIGURED", -2)  # were the exit 0
    _files(root / "etc", None)
    check = _doctor(root, make_settings)
    assert check.status == doctor.OK
    assert "domain UNAVAILABLE (field 1502, passes)" in check.message and "daemon -3 (field 1503" in check.message


@needs_namespace
def test_a_stock_nodes_file_left_readable(tmp_path: Path, root: Path, make_settings: Any) -> None:
    """A nodes file at the default path: -N asks those trays' command ports, nothing answers, the domain is DOWN,
    and DCGM raises incident 122 for the domain as well, on an idle tray.  Doctor WARNs."""
    upper = tmp_path / "upper"
    _files(upper, "127.0.0.2\n127.0.0.3\n")
    domain_run = _ctl_at_default_path(upper, "-N", "-j")
    daemon_run = _ctl_at_default_path(upper, "-q")
    assert domain_run[0] == 0 and daemon_run[0] == 1  # no daemon answers -q
    reading = dcgm.read(domain_run, daemon_run)
    assert reading.domain == "DOWN" and reading.daemon == -3
    assert "DCGM_FR_IMEX_UNHEALTHY: IMEX domain status is DOWN (unhealthy)" in reading.incidents
    _files(root / "etc", "127.0.0.2\n127.0.0.3\n")
    check = _doctor(root, make_settings)
    assert check.status == doctor.WARN and "(2 entries)" in check.message and "DOWN or DEGRADED" in check.message
    assert check.fix.startswith("move it away (mv /etc/nvidia-imex/nodes_config.cfg")


def test_doctor_follows_the_config_to_the_nodes_file_it_names(root: Path, make_settings: Any) -> None:
    """A default config pointed at a job's nodes file (someone's shortcut) is a readable nodes file too."""
    (root / "etc/nvidia-imex").mkdir(parents=True)
    job_nodes = root / "run/imexctl/jobs/41/nodes_config.cfg"
    (root / "etc/nvidia-imex/config.cfg").write_text(
        STOCK_CONFIG.replace("/etc/nvidia-imex/nodes_config.cfg", "/run/imexctl/jobs/41/nodes_config.cfg")
    )
    assert _doctor(root, make_settings).status == doctor.OK  # the job's file is gone
    job_nodes.parent.mkdir(parents=True)
    job_nodes.write_text("10.0.0.1\n")
    check = _doctor(root, make_settings)
    assert check.status == doctor.WARN and check.message.startswith("/run/imexctl/jobs/41/nodes_config.cfg (1 entry)")


def test_no_imex_package_config_at_all(root: Path, make_settings: Any) -> None:
    check = _doctor(root, make_settings)
    assert check.status == doctor.OK and check.message.startswith("no /etc/nvidia-imex/config.cfg")
