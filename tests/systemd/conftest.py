"""Fixtures of the booted-node tests (``pytest -m systemd``): one SystemdLab for the session, a clean one per test.

The lab (tests/lab/sysd.py) boots a controller and two compute nodes, each a Debian 13 root with systemd as
PID 1 under systemd-nspawn, and installs imexctl on the nodes by the commands of docs/install.md. It needs
root, systemd-nspawn (``apt-get install systemd-container``), overlayfs, network and time namespaces, and the
cached Debian root (built on first use: debootstrap and the Debian mirror). Without them the tests skip with
the reason, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest

from tests.lab import debroot
from tests.lab.cluster import LabError, LabUnavailable
from tests.lab.jobs import USER, install_stepcheck
from tests.lab.nspawn import boot_problems, nspawn_problems
from tests.lab.sysd import NAMES, SystemdLab
from tests.simhelpers import wait_for
from tests.support.ci import unavailable
from tests.systemd.nodes import NODES, leftover_units, restore


def _unavailable(reason: str) -> None:
    """Skip with the reason, or fail when CI=true (CI must never skip these tests)."""
    __tracebackhide__ = True
    unavailable(f"systemd lab unavailable: {reason}")


def _root() -> debroot.DebRoot:
    problems = nspawn_problems()
    if problems:
        _unavailable("; ".join(problems))
    try:
        root = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True))
    except LabError as exc:
        _unavailable(str(exc))
    problems = boot_problems(root.path, f"{NAMES.prefix}-probe")
    if problems:
        _unavailable("; ".join(problems))
    return root


@pytest.fixture(scope="package")
def sysd() -> Iterator[SystemdLab]:
    """A controller and two booted nodes with imexctl installed as docs/install.md says, for these tests
    (down again before the real-Slurm lab's tests run)."""
    lab = SystemdLab(_root().path, nodes=len(NODES), owner_pid=os.getpid())
    try:
        lab.up()
    except LabUnavailable as exc:
        _unavailable(str(exc))
    try:
        install_stepcheck(lab)
        yield lab
    finally:
        lab.down()


@pytest.fixture(autouse=True)
def fresh(request: pytest.FixtureRequest) -> Iterator[None]:
    """Give each systemd test idle nodes without faults, and put them back that way afterwards."""
    if request.node.get_closest_marker("systemd") is None:
        yield
        return
    lab: SystemdLab = request.getfixturevalue("sysd")
    for n in NODES:
        lab.set_faults(n, "")
    yield
    for n in NODES:
        lab.set_faults(n, "")

    def drained() -> bool:
        if not lab.run(["squeue", "-h"], check=False).stdout.strip():
            return True
        lab.run(["scancel", "--user", USER], check=False)
        return False

    wait_for(drained, 60, 0.5, what="the queue to drain")
    for node, st in lab.node_states().items():
        if st["state"] != "idle":
            lab.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    lab.wait_idle(timeout=60)
    left = leftover_units(lab)
    if left:
        warnings.warn(f"after {request.node.name}: job units left {left}; stopped them", stacklevel=1)
        for n in left:
            restore(lab, n)
