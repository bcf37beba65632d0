"""Fixtures of the real-Slurm tests: one 4-node lab per Slurm version, an idle and clean cluster per test.

Each test runs once per Slurm version, and its id names it (``test_x[26.05]``; ``-k 26.05`` picks one):
Debian 12's 22.05 from the host, Debian 13's 24.11 and Debian sid's 26.05 from cached Debian roots (built
on first use, or in the background by ``.ci/setup test``). The tests need root, network namespaces, Slurm + munge on the host,
imexctl in /opt/imexctl, the user ``imexlab`` (uid 1501, group 1502), and for 24.11 debootstrap, overlayfs and the
Debian mirror (first build only). Without them they skip, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import warnings
from collections.abc import Iterator

import pytest

from tests.lab import debroot
from tests.lab.cluster import REPO, LabError, LabUnavailable, SlurmLab
from tests.lab.jobs import (
    GID,
    IMEXCTL,
    PROLOG_TIMEOUT,
    SIM,
    SIM_CTL,
    UID,
    USER,
    imexctl_admin,
    install_stepcheck,
    leftovers,
)
from tests.lab.versions import HostSlurm, RootSlurm, SlurmInstall
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

#: the Slurm versions the lab runs; IMEXCTL_LAB_SLURM (a comma list) keeps some of them, so that python -m tests
#: can run each version's lab in a pytest process of its own
ALL_SLURMS = ("22.05", "24.11", "26.05")
_WANTED = os.environ.get("IMEXCTL_LAB_SLURM", "").split(",") if os.environ.get("IMEXCTL_LAB_SLURM") else ALL_SLURMS
SLURMS = tuple(v for v in ALL_SLURMS if v in _WANTED)
if not SLURMS:
    raise ValueError(f"IMEXCTL_LAB_SLURM={os.environ['IMEXCTL_LAB_SLURM']!r} names none of {', '.join(ALL_SLURMS)}")
NODES = ["node1", "node2", "node3", "node4"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the lab tests after all others, booted nodes then real Slurm (a quick verdict first; the Debian
    root builds meanwhile)."""
    rank = {None: 0, "systemd": 1, "slurm": 2}
    items.sort(key=lambda i: rank[next((m for m in ("slurm", "systemd") if i.get_closest_marker(m)), None)])


def _unavailable(reason: str) -> None:
    """Skip, or fail when CI=true (CI must never skip these tests silently)."""
    __tracebackhide__ = True
    unavailable(f"slurm lab unavailable: {reason}")


def _host_problems() -> list[str]:
    """Return why this machine cannot run the tests, whatever the Slurm version."""
    problems = []
    for exe in (IMEXCTL, SIM, SIM_CTL):
        if not os.access(exe, os.X_OK):
            problems.append(f"{exe} missing (bash .ci/setup test)")
    try:
        pw = pwd.getpwnam(USER)
        if pw.pw_uid != UID:
            problems.append(f"user {USER} has uid {pw.pw_uid}, not {UID}")
        if pw.pw_gid != GID:  # the channel's group is checked apart from its owner
            problems.append(f"user {USER} has group {pw.pw_gid}, not {GID} (bash .ci/setup test)")
    except KeyError:
        problems.append(f"user {USER} missing (useradd -u {UID} -M -s /usr/sbin/nologin {USER})")
    return problems


def _install(version: str) -> SlurmInstall:
    """Return the Slurm install that provides ``version`` (building its Debian root if needed)."""
    if version == "22.05":
        return HostSlurm()
    try:
        root = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True), suite=debroot.SUITES[version])
    except LabError as exc:
        _unavailable(str(exc))
    return RootSlurm(root.path, RootSlurm.SERIES_NAMES[version])


def _imexctl_source() -> str:
    """Return where /opt/imexctl imports imexctl from."""
    res = subprocess.run(
        [str(IMEXCTL.parent / "python"), "-c", "import imexctl; print(imexctl.__file__)"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return res.stdout.strip()


@pytest.fixture(scope="session", params=SLURMS, ids=SLURMS)
def lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    """A 4-node cluster of one Slurm version running this checkout's hooks, up for the whole session."""
    problems = _host_problems()
    if problems:
        _unavailable("; ".join(problems))
    the_lab = SlurmLab(
        _install(request.param),
        nodes=len(NODES),
        slurmd_debug="debug2",
        prolog_epilog_timeout=PROLOG_TIMEOUT,
        owner_pid=os.getpid(),
        task_prolog=REPO / "hooks" / "task-prolog",
    )
    try:
        the_lab.up()
    except LabUnavailable as exc:
        _unavailable(str(exc))
    try:
        if not the_lab.version.startswith(f"{request.param}."):
            _unavailable(f"this parameter wants Slurm {request.param}, the lab runs {the_lab.version}")
        install_stepcheck(the_lab)
        source = _imexctl_source()
        if request.param == "22.05" and source and not source.startswith(str(REPO)):
            warnings.warn(f"{IMEXCTL} runs imexctl from {source}, not from this checkout", stacklevel=1)
        yield the_lab
    finally:
        the_lab.down()


@pytest.fixture(autouse=True)
def fresh(lab: SlurmLab, request: pytest.FixtureRequest) -> Iterator[None]:
    """Give each test an idle cluster without faults, and put it back that way afterwards."""
    lab.faults.write_text("")
    yield
    lab.faults.write_text("")

    def drained() -> bool:
        # a job may still be completing or about to be requeued: cancel again until the queue is empty
        if not lab.run(["squeue", "-h"], check=False).stdout.strip():
            return True
        lab.run(["scancel", "--user", USER], check=False)
        lab.run(["scancel", "--user", "root"], check=False)
        return False

    wait_for(drained, 60, 0.5, what="the queue to drain")
    for node, st in lab.node_states().items():
        if st["state"] != "idle":
            lab.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    lab.wait_idle(timeout=30)
    for node in NODES:
        left = leftovers(lab, node)
        if left:
            warnings.warn(f"after {request.node.name}: {node} had leftovers, ran cleanup --force: {left}", stacklevel=1)
            imexctl_admin(lab, node, "cleanup", "--force", check=False)
