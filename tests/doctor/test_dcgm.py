"""Doctor's ``imex.dcgm``: the DCGM installed on the tray, and which of the shipped watch settings applies.

A fake DCGM install (tests/support/dcgm.py: dpkg's status file, the core package's versioned library)
under the tray root; the range doctor names is held to the recorded health-system spans
(tests/data/dcgm/health.json), and the IMEX side of the check (tests/sim/test_dcgm_view.py) still decides
its WARN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog

from imexctl.doctor import dcgm as doctor_dcgm
from imexctl.doctor import framework as doctor
from imexctl.doctor import run as doctor_run
from imexctl.hooks.runtime import Runtime
from tests.support import dcgm
from tests.support.fakes import FakeGpu, FakeHost

#: which recorded IMEX carrier each range doctor names stands for
CARRIER = {"4.4 and before": None, "4.5-4.6": "NVLINK", "4.7 and later": "IMEX"}


def _check(root: Path, make_settings: Any) -> tuple[doctor.Check, FakeHost]:
    host = FakeHost()
    rt = Runtime(host, FakeGpu(), make_settings(), structlog.get_logger())
    checks = {c.name: c for c in doctor_run.run(doctor.Context(rt, {}, "gb01"))}
    return checks["imex.dcgm"], host


@pytest.mark.parametrize(
    ("package", "field", "label"),
    [
        ("datacenter-gpu-manager", "1:3.3.9", "4.4 and before"),
        ("datacenter-gpu-manager-4-core", "1:4.4.2-1", "4.4 and before"),
        ("datacenter-gpu-manager-4-core", "1:4.5.0-1", "4.5-4.6"),
        ("datacenter-gpu-manager-4-core", "1:4.6.1-1", "4.5-4.6"),
        ("datacenter-gpu-manager-4-core", "1:4.7.0-1", "4.7 and later"),
        ("datacenter-gpu-manager-4-core", "1:4.10.2-1", "4.7 and later"),
    ],
)
def test_the_dpkg_version_picks_the_range_of_the_recorded_imex_check(
    root: Path, make_settings: Any, package: str, field: str, label: str
) -> None:
    dcgm.install_dpkg(root, "datacenter-gpu-manager-exporter", "4.8.2-1")  # dcgm-exporter's, not DCGM
    dcgm.install_dpkg(root, package, field)
    check, host = _check(root, make_settings)
    upstream = field.split(":")[1].split("-", maxsplit=1)[0]
    assert check.status == doctor.OK
    assert f"DCGM {upstream} (dpkg: {package} {field})" in check.message
    assert f"{doctor_dcgm.SETTINGS}/dcgmi-health.txt [{label}]" in check.message
    span = next(s for s in doctor_dcgm.SPANS if s.label == label)
    assert span.command in check.message and "dcgmi health -f" in check.message
    assert CARRIER[label] == dcgm.imex_system(dcgm.version(upstream))
    assert not [argv for argv in host.calls if "dcgmi" in " ".join(argv)]  # read, never asked


def test_a_removed_package_does_not_count_and_the_library_speaks_instead(root: Path, make_settings: Any) -> None:
    """dpkg keeps a removed package's stanza (config-files); an RPM system has only the library's name."""
    dcgm.install_dpkg(root, "datacenter-gpu-manager-4-core", "1:4.5.3-1", status="deinstall ok config-files")
    dcgm.install_library(root, "/usr/lib64", "4.7.1")
    check, _ = _check(root, make_settings)
    assert check.status == doctor.OK
    assert "DCGM 4.7.1 (/usr/lib64/libdcgm.so.4.7.1)" in check.message and "[4.7 and later]" in check.message


def test_no_dcgm_on_the_tray(root: Path, make_settings: Any) -> None:
    check, _ = _check(root, make_settings)
    assert check.status == doctor.OK
    assert "no DCGM installed here" in check.message and doctor_dcgm.SETTINGS in check.message


def test_two_dcgm_versions_leave_it_unknown_which_runs(root: Path, make_settings: Any) -> None:
    dcgm.install_library(root, "/usr/lib/aarch64-linux-gnu", "4.6.0")
    dcgm.install_library(root, "/usr/lib64", "4.7.0")
    check, _ = _check(root, make_settings)
    assert check.status == doctor.WARN
    assert "4.6.0 (/usr/lib/aarch64-linux-gnu/libdcgm.so.4.6.0)" in check.message
    assert "4.7.0 (/usr/lib64/libdcgm.so.4.7.0)" in check.message
    assert check.fix.startswith("remove the DCGM that does not run")


def test_the_imex_side_still_warns_and_keeps_its_fix(root: Path, make_settings: Any) -> None:
    """A readable default nodes file WARNs as before; the DCGM part is added to the same line."""
    (root / "etc/nvidia-imex").mkdir(parents=True)
    (root / "etc/nvidia-imex/config.cfg").write_text("IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n")
    (root / "etc/nvidia-imex/nodes_config.cfg").write_text("10.0.0.1\n10.0.0.2\n")
    dcgm.install_dpkg(root, "datacenter-gpu-manager-4-core", "1:4.6.0-1")
    check, _ = _check(root, make_settings)
    assert check.status == doctor.WARN
    assert check.message.startswith("/etc/nvidia-imex/nodes_config.cfg (2 entries)")
    assert "DCGM 4.6.0 (dpkg: datacenter-gpu-manager-4-core 1:4.6.0-1)" in check.message
    assert check.fix.startswith("move it away")
