"""The port guard measured under a booted systemd: who may bind() a port of the job ranges (issue 41).

imexctl ships ``systemd/port-guard.slice.conf`` (for ``user.slice``: logins) and
``port-guard.scope.conf`` (for ``slurmstepd.scope``: cgroup/v2 Slurm's job
steps), each ``SocketBindDeny=tcp:61000-62999``.  Here they are installed as
docs/install.md says into a booted Debian root (systemd-nspawn, systemd as
PID 1) and tried with real processes:

- Debian 13 (systemd 257, ``+BPF_FRAMEWORK``): a process of uid 1501 in
  ``user.slice`` gets ``EPERM`` for a port of either range and binds one
  outside them; so does a step of a job in ``slurmstepd.scope`` made as
  slurmd makes it (a transient scope with ``Delegate=yes``, the step in
  ``job_<id>/step_<n>`` below it), root's too; a root service in
  ``system.slice``, where ``imexctl-imex@.service`` runs, binds the ports.
- Debian 12 (systemd 252, ``-BPF_FRAMEWORK``): systemd takes the rule (``systemctl
  show`` lists it) and enforces nothing: the user binds the port.  doctor's
  ``ports.guard`` keys its WARN on that build flag.

These machines are containers of their own, not the Slurm lab's nodes:
nspawn's seccomp filter refuses ``bpf()`` to the container unless it is let
through (``--system-call-filter=bpf``), and with it refused systemd attaches
no bind program (measured: the rule is then shown and not enforced on
Debian 13 too).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import debroot
from tests.lab.nspawn import Container, boot_problems, nspawn_problems
from tests.lab.procs import LabError, sh
from tests.support.ci import unavailable

pytestmark = pytest.mark.systemd

REPO = Path(__file__).resolve().parents[2]
#: the packages of the Debian 12 root (the lab's Debian 12 runs from the host, whose PID 1 is not systemd)
BOOKWORM_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3")
#: the local user of the tests (tests/support/localuser.py), by number: the Debian 12 root has no such user
UID, GID = 1501, 1502
JOB = 4271
IN_RANGE = (61000 + JOB % 1000, 62000 + JOB % 1000, 61000, 62999)
OUTSIDE = (8080, 60999, 63000)
#: binds each port given and prints a JSON line: port -> errno (0: bound), and its own cgroup
PROBE = """\
import json, os, socket, sys
def bind(port):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        return 0
    except OSError as exc:
        return exc.errno
    finally:
        s.close()
ids = sys.argv[1].split(":")
step = None
if ids[0] == "step":  # a job step as Slurm's cgroup/v2 plugin makes it: job_<id>/step_0 below the scope
    rel = open("/proc/self/cgroup").read().split("0::", 1)[1].splitlines()[0]
    mount = next(line.split()[1] for line in open("/proc/self/mounts") if line.split()[2] == "cgroup2")
    step = f"{mount}{rel}/job_{ids[1]}/step_0"
    os.makedirs(step)
    with open(f"{step}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    ids = ids[2:]
if ids and ids[0]:
    os.setgroups([])
    os.setgid(int(ids[1]))
    os.setuid(int(ids[0]))
cgroup = open("/proc/self/cgroup").read().split("0::", 1)[1].splitlines()[0]
print(json.dumps({"uid": os.getuid(), "cgroup": cgroup, "binds": {p: bind(int(p)) for p in sys.argv[2:]}}))
"""


class Machine(Container):
    """A booted container whose services may call ``bpf()`` (systemd's bind programs need it)."""

    def _argv(self) -> list[str]:
        argv = super()._argv()
        return [*argv[:-1], "--system-call-filter=bpf", argv[-1]]


def _boot(root: Path, name: str) -> Iterator[Machine]:
    problems = nspawn_problems() or boot_problems(root, f"{name}-probe")
    if problems:
        unavailable("booted nodes unavailable: " + "; ".join(problems))
    top = Path(f"/var/tmp/{name}")
    sh(["ip", "netns", "add", name])
    m = Machine(name, name, top, root, name)
    try:
        m.mount()
        m.start()
        m.wait_booted()
        _install(m)
        yield m
    finally:
        m.stop()
        if top.exists():
            m.unmount()
        sh(["ip", "netns", "delete", name], check=False)
        shutil.rmtree(top, ignore_errors=True)


def _install(m: Machine) -> None:
    """The shipped drop-ins as docs/install.md installs them, the probe, and a trigger for the slice."""
    for unit, name in (("user.slice", "slice"), ("slurmstepd.scope", "scope")):
        dest = m.merged / f"etc/systemd/system/{unit}.d/imexctl-port-guard.conf"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text((REPO / f"systemd/port-guard.{name}.conf").read_text())
    probe = m.merged / "usr/local/bin/imexctl-bindprobe"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    m.exec(["systemctl", "daemon-reload"])
    # what docs/install.md has the admin run: a unit in the slice, so systemd attaches the rule now
    m.exec(["systemd-run", "--slice=user.slice", "--wait", "--quiet", "/bin/true"])


def _probe(m: Machine, where: list[str], who: str, ports: tuple[int, ...]) -> dict[str, object]:
    """Run the probe in a transient unit (``where``: systemd-run's options) as ``who`` (``uid:gid``, '' for root)."""
    argv = ["systemd-run", *where, "--quiet", "/usr/bin/python3", "/usr/local/bin/imexctl-bindprobe", who]
    done = m.exec([*argv, *map(str, ports)], check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _binds(found: dict[str, object]) -> dict[int, int]:
    binds = found["binds"]
    assert isinstance(binds, dict)
    return {int(p): int(e) for p, e in binds.items()}


@pytest.fixture(scope="module")
def trixie() -> Iterator[Machine]:
    """The systemd lab's Debian 13 root, booted with bpf() let through."""
    try:
        root = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True))
    except LabError as exc:
        unavailable(f"no Debian 13 root: {exc}")
    yield from _boot(root.path, f"imxpg13-{os.getpid() % 100000}")


@pytest.fixture(scope="module")
def bookworm() -> Iterator[Machine]:
    """A bare Debian 12 root with systemd, booted the same way."""
    try:
        root = debroot.plain_root("portguard", "bookworm", BOOKWORM_PACKAGES, log=print)
    except LabError as exc:
        unavailable(f"no Debian 12 root: {exc}")
    yield from _boot(root, f"imxpg12-{os.getpid() % 100000}")


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """Not the Slurm lab's nodes (tests/systemd/conftest.py boots those): these tests boot their own machines."""
    yield


USER = f"{UID}:{GID}"
LOGIN = ["--slice=user.slice", "--wait", "--pipe"]
STEP = ["--scope", "--unit=slurmstepd", "--slice=system.slice", "--property=Delegate=yes"]


def test_on_debian_13_a_login_may_not_bind_the_ranges_and_may_bind_outside(trixie: Machine) -> None:
    """uid 1501 in user.slice: EPERM in 61000-62999 (the job's ports and both ends), other ports bind."""
    assert "+BPF_FRAMEWORK" in trixie.exec(["systemctl", "--version"]).stdout.split()
    found = _probe(trixie, LOGIN, USER, IN_RANGE + OUTSIDE)
    assert found["uid"] == UID and str(found["cgroup"]).startswith("/user.slice/"), found
    assert _binds(found) == {**dict.fromkeys(IN_RANGE, errno.EPERM), **dict.fromkeys(OUTSIDE, 0)}


def test_on_debian_13_a_job_step_may_not_bind_the_ranges(trixie: Machine) -> None:
    """A step in slurmstepd.scope/job_4271/step_0 (the scope made as slurmd makes it): EPERM for the user and for
    root (slurmstepd), so SrunPortRange must stay out of the ranges; outside them it binds."""
    user = _probe(trixie, STEP, f"step:{JOB}:{USER}", IN_RANGE + OUTSIDE)
    assert str(user["cgroup"]).endswith(f"/slurmstepd.scope/job_{JOB}/step_0") and user["uid"] == UID, user
    assert _binds(user) == {**dict.fromkeys(IN_RANGE, errno.EPERM), **dict.fromkeys(OUTSIDE, 0)}
    root = _probe(trixie, STEP, f"step:{JOB + 1}:", IN_RANGE[:1] + OUTSIDE[:1])
    assert _binds(root) == {IN_RANGE[0]: errno.EPERM, OUTSIDE[0]: 0}, root


def test_on_debian_13_the_imex_daemons_unit_binds_its_ports(trixie: Machine) -> None:
    """root's service in system.slice, named as the prolog names a job's unit: the job's two ports bind."""
    unit = ["--unit=imexctl-imex@4271.service", "--wait", "--pipe"]
    found = _probe(trixie, unit, "", IN_RANGE)
    assert str(found["cgroup"]).startswith("/system.slice/") and "imexctl-imex@4271.service" in str(found["cgroup"])
    assert _binds(found) == dict.fromkeys(IN_RANGE, 0), found


def test_on_debian_12_systemd_takes_the_rule_and_enforces_nothing(bookworm: Machine) -> None:
    """systemd 252 without BPF_FRAMEWORK: ``systemctl show`` lists the rule, and uid 1501 binds the job's port."""
    version = bookworm.exec(["systemctl", "--version"]).stdout
    assert version.startswith("systemd 252 ") and "-BPF_FRAMEWORK" in version.split(), version
    shown = bookworm.show("user.slice", "SocketBindDeny")
    assert shown == {"SocketBindDeny": "tcp61000-62999"}, shown
    found = _probe(bookworm, LOGIN, USER, IN_RANGE[:2])
    assert str(found["cgroup"]).startswith("/user.slice/"), found
    assert _binds(found) == dict.fromkeys(IN_RANGE[:2], 0), found
