"""tests/gpu/test_nvml.py passes under every nvidia-ml-py release pinned in .ci/nvml-versions.

Each release has its own virtual environment at /opt/imexctl-nvml/<name>, made
by ``bash .ci/setup test``; imexctl is imported from this checkout (PYTHONPATH).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / ".ci" / "nvml-versions"
VENVS = Path("/opt/imexctl-nvml")


def _pins() -> dict[str, str]:
    pins = {}
    for line in PINS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("=")
            pins[name.strip()] = version.strip()
    return pins


def test_pins_are_the_oldest_allowed_and_a_newer_one() -> None:
    """The pin file names an 'oldest' release that setup.cfg's lower bound admits, a release of the
    13.580-13.610 line whose legacy class misread the fabric, and a 'newest'."""
    pins = _pins()
    assert set(pins) == {"oldest", "legacy-mismatch", "newest"}
    assert pins["legacy-mismatch"].startswith(("13.58", "13.59", "13.60", "13.610.")), pins["legacy-mismatch"]
    bound = re.search(r"nvidia-ml-py>=([0-9.]+)", (REPO / "setup.cfg").read_text())
    assert bound is not None, "setup.cfg must give nvidia-ml-py a lower bound"
    assert pins["oldest"].startswith(bound.group(1) + "."), (pins["oldest"], bound.group(1))

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    assert key(pins["oldest"]) < key(pins["legacy-mismatch"]) < key(pins["newest"])


@pytest.mark.parametrize("name", sorted(_pins()))
def test_nvml_tests_pass_under(name: str) -> None:
    """The stand-in NVML tests all pass (none skipped) with this nvidia-ml-py."""
    version = _pins()[name]
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        unavailable(f"{python} is missing: 'bash .ci/setup test' creates it with nvidia-ml-py {version}")
    have = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('nvidia-ml-py'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.strip()
    assert have == version, f"{python} has nvidia-ml-py {have!r}, .ci/nvml-versions pins {version}: rerun .ci/setup"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), "-m", "pytest", "tests/gpu/test_nvml.py", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.fullmatch(r"=*\s*\d+ passed in [0-9.]+s\s*=*", summary), summary
