"""pkg/requirements.lock: the bundled dependencies' pins and hashes (the build itself: tests/test_packaging.py)."""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "pkg"))
import wheels  # noqa: E402 # pkg/wheels.py


def _locked() -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, [sha256, ...])}`` of the lock file."""
    text = wheels.LOCK.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            spec, *hashes = line.split(" --hash=")
            name, _, version = spec.split(";")[0].strip().partition("==")
            out[name] = (version, [h.strip().removeprefix("sha256:") for h in hashes])
    return out


def test_lock_holds_exactly_the_pins() -> None:
    """The lock pins what pkg/requirements.in pins, each with the sha256 of at least one wheel."""
    locked = _locked()
    assert {name: version for name, (version, _h) in locked.items()} == wheels.pins()
    for name, (_version, hashes) in locked.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    assert len(locked["psutil"][1]) >= len(wheels.ARCHES), "psutil has a compiled wheel for each machine"


def test_pins_satisfy_setup_cfg() -> None:
    """Every install_requires of setup.cfg is pinned, at a version it allows."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    pins = wheels.pins()
    for line in filter(None, cfg["options"]["install_requires"].split("\n")):
        req = Requirement(line)
        assert wheels.normalize(req.name) in pins, req.name
        assert req.specifier.contains(pins[wheels.normalize(req.name)]), line


def test_nvidia_ml_py_is_a_known_good_release() -> None:
    """The bundled nvidia-ml-py is the newest release the NVML matrix tests, outside the ranges docs/nvml.md
    lists as misreading the fabric."""
    pinned = wheels.pins()["nvidia-ml-py"]
    matrix = dict(line.split("=", 1) for line in (REPO / ".ci/nvml-versions").read_text().splitlines() if "=" in line)
    assert pinned == matrix["newest"]
    major, minor = (int(part) for part in pinned.split(".")[:2])
    assert not (major == 12 and 535 <= minor <= 575) and not (major == 13 and 580 <= minor <= 610)


def test_tomli_only_below_python_3_11() -> None:
    """tomli (tomllib's package) is locked for EL9's 3.9 and left out for 3.11 and 3.13, as setup.cfg's marker says."""
    assert "tomli" in wheels.pins_for("3.9") and "tomli" in wheels.pins()
    assert "tomli" not in wheels.pins_for("3.11") and "tomli" not in wheels.pins_for("3.13")
    assert "tomli==" in wheels.locked_for("3.9") and "tomli" not in wheels.locked_for("3.11")
    assert ";" not in wheels.locked_for("3.9"), "pip judges markers by its own Python: none reach it"
    assert wheels.locked_for("3.11").count("==") == len(wheels.pins()) - 1


def test_markers() -> None:
    """Only ``python_version <op> "X.Y"`` markers are taken, compared as version numbers."""
    assert wheels.applies("", "3.9") and wheels.applies('python_version < "3.11"', "3.9")
    assert not wheels.applies('python_version < "3.11"', "3.11")
    assert wheels.applies('python_version >= "3.10"', "3.13") and not wheels.applies('python_version=="3.9"', "3.10")
    assert wheels.applies('python_version != "3.9"', "3.11")
    with pytest.raises(ValueError, match="is not python_version"):
        wheels.applies('sys_platform == "linux"', "3.9")
