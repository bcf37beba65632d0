"""The Ansible role (deploy/ansible) run by ``ansible-playbook`` against booted nodes, over ssh, as at a site.

Marker ``systemd``: a lab of its own (tests/lab/sysd.py, names ``imxan``,
198.18.4.0/24) boots a controller and two nodes with systemd, slurmd and the stand-in NVIDIA side, but
without imexctl (``site_install=False``). Before the role, as a site's image would have them: root's
authorized key for sshd; NVIDIA's ``nvidia-imex`` as a package (a stand-in .deb of 580.95.05 whose
binaries run the simulator from ``/opt/imexsim``, its stock unit enabled and running); a firewall whose
``inet filter input`` chain drops both IMEX port ranges. The role gets the .deb built from this checkout
for the nodes' Python (``IMEXCTL_PYTHON``), the lab's config, a topology.conf, the rack's subnet and the
driver's version (no NVIDIA driver in the nodes). Debian 12's ``ansible`` (ansible-core 2.14) runs
``deploy/ansible/site.yml`` as it is.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl import __version__
from tests.lab import debroot, siteinstall
from tests.lab.cluster import LabError, LabUnavailable
from tests.lab.jobs import assert_domain_up, install_stepcheck, read_steps, release, sbatch, step_argv, wait_done
from tests.lab.nspawn import boot_problems, nspawn_problems
from tests.lab.sysd import FAULTS, STOCK_UNIT, UNIT_DIR, SystemdLab
from tests.lab.versions import LabNames
from tests.simhelpers import wait_for

pytestmark = pytest.mark.systemd

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "deploy/ansible/site.yml"
NAMES = LabNames(prefix="imxan", bridge="imxanbr0", subnet="198.18.4", ctl_port=6817, first_job_id=400000)
NODES = ["node1", "node2"]
#: the driver the nodes pretend to run, and the stand-in nvidia-imex package's version
DRIVER = "580.95.05"
SUBNET = f"{NAMES.subnet}.0/24"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
CONFIG = {
    # the lab's own (tests/lab/sysd.py IMEXCTL_CONFIG): the stand-in driver's /proc/devices, no NVML
    "paths": {"proc_devices": "/etc/imexlab/devices", "topology_file": "/etc/slurm/topology.conf"},
    "policy": {"fabric": "none"},
    "metrics": {"textfile_dir": TEXTFILE_DIR},
}
TOPOLOGY = "BlockName=r01 Nodes=node[1-2]\nBlockSizes=2\n"
#: a site's firewall: everything it does not know about the IMEX ports is dropped
FIREWALL = """\
#!/usr/sbin/nft -f
flush ruleset
table inet filter {
    chain input {
        type filter hook input priority filter; policy accept;
        tcp dport 61000-62999 drop
    }
}
"""
SIM_LAUNCHER = """\
#!/bin/sh
# stand-in for NVIDIA's {real} (tests/ansible/test_role.py): the simulator
{faults}exec /opt/imexsim/bin/{sim} "$@"
"""
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"systemd lab unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(f"systemd lab unavailable: {reason}")


def _tools() -> None:
    missing = [
        t
        for t in ("ansible-playbook", "ssh-keygen", "ssh-keyscan", "dpkg-buildpackage", "dpkg-deb")
        if not shutil.which(t)
    ]
    if missing:
        _unavailable(f"needs {', '.join(missing)} (bash .ci/setup test installs them)")


@pytest.fixture(scope="module")
def root() -> debroot.DebRoot:
    """The cached Debian 13 root the nodes boot (tests/lab/debroot.py)."""
    _tools()
    problems = nspawn_problems()
    if problems:
        _unavailable("; ".join(problems))
    try:
        found = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True))
    except LabError as exc:
        _unavailable(str(exc))
    problems = boot_problems(found.path, f"{NAMES.prefix}-probe")
    if problems:
        _unavailable("; ".join(problems))
    return found


@pytest.fixture(scope="module")
def deb(root: debroot.DebRoot, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The .deb of this checkout for the nodes' Python (dpkg-buildpackage with IMEXCTL_PYTHON)."""
    pyver = ".".join(str(root.info["python"]).split(".")[:2])
    src = tmp_path_factory.mktemp("deb") / "imexctl"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name, follow_symlinks=False)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root", "IMEXCTL_PYTHON": pyver}
    done = subprocess.run(
        ["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, capture_output=True, text=True, timeout=900, env=env,
        check=False,
    )  # fmt: skip
    if done.returncode != 0 and "NewConnectionError" in done.stdout + done.stderr:
        _unavailable("pip cannot reach the package index for the .deb's dependencies")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (found,) = src.parent.glob(f"imexctl_{__version__}_*.deb")
    depends = subprocess.run(["dpkg-deb", "-f", str(found), "Depends"], capture_output=True, text=True, check=True)
    assert f"python3 (>= {pyver})" in depends.stdout
    return found


@pytest.fixture(scope="module")
def lab(root: debroot.DebRoot) -> Iterator[SystemdLab]:
    """The controller and two booted nodes, without imexctl, as a site's image has them (the module docstring)."""
    # CAP_NET_ADMIN: the role's nft runs in the node over ssh, as root on a tray may (nspawn leaves it out)
    lab = SystemdLab(
        root.path, len(NODES), owner_pid=os.getpid(), names=NAMES, site_install=False, capabilities=["CAP_NET_ADMIN"]
    )
    try:
        lab.up()
    except LabUnavailable as exc:
        _unavailable(str(exc))
    try:
        install_stepcheck(lab)
        _image(lab)
        yield lab
    finally:
        lab.down()


def _image(lab: SystemdLab) -> None:
    """What the nodes' image holds before the role: the simulator, nvidia-imex as a package, the firewall."""
    imex = _imex_deb(lab.dir)
    for node in NODES:
        m = lab.node(node)
        # the simulator in an environment of its own (the lab's wheels, the node's copy of the checkout)
        venv = "/usr/bin/python3 -m venv /opt/imexsim"
        pip = f"/opt/imexsim/bin/pip install -q --no-index --find-links {siteinstall.WHEELS} {siteinstall.CHECKOUT}"
        m.shell(f"{venv} && {pip}", cwd=siteinstall.CHECKOUT, timeout=600)
        m.exec(["dpkg", "-i", str(imex)], timeout=120)
        assert m.exec(["systemctl", "is-active", "nvidia-imex.service"], check=False).stdout.strip() == "active"
        m.shell(f"cat >/etc/nftables.conf <<'EOF'\n{FIREWALL}EOF\nnft -f /etc/nftables.conf")


def _imex_deb(where: Path) -> Path:
    """NVIDIA's nvidia-imex package as a stand-in: its binaries (the simulator), its stock unit, its version."""
    tree = where / "nvidia-imex-pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: nvidia-imex\nVersion: {DRIVER}-1\nArchitecture: all\nMaintainer: lab <lab@localhost>\n"
        "Description: stand-in for NVIDIA's nvidia-imex (tests/ansible/test_role.py)\n"
    )
    for real, sim in (("nvidia-imex", "nvidia-imex-sim"), ("nvidia-imex-ctl", "nvidia-imex-ctl-sim")):
        path = tree / "usr/bin" / real
        path.parent.mkdir(parents=True, exist_ok=True)
        faults = f"IMEX_SIM_FAULTS_FILE={FAULTS} " if real == "nvidia-imex" else ""
        path.write_text(SIM_LAUNCHER.format(real=f"/usr/bin/{real}", sim=sim, faults=faults))
        path.chmod(0o755)
    unit = tree / UNIT_DIR.lstrip("/") / "nvidia-imex.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(STOCK_UNIT)
    out = where / f"nvidia-imex_{DRIVER}-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out)], check=True, timeout=120, capture_output=True
    )
    return out


@pytest.fixture(scope="module")
def site(lab: SystemdLab, deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The admin's side: an ssh key the nodes trust, known_hosts, the inventory and the site's variables."""
    top = tmp_path_factory.mktemp("site")
    key = top / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    pub = (top / "id_ed25519.pub").read_text().strip()
    for node in NODES:
        m = lab.node(node)
        m.shell(f"install -d -m 0700 /root/.ssh && printf '%s\\n' {shlex.quote(pub)} >/root/.ssh/authorized_keys")
        wait_for(
            lambda m=m: m.exec(["systemctl", "is-active", "ssh.service"], check=False).stdout.strip() == "active",
            60,
            0.5,
            what="sshd",
        )
    scan = subprocess.run(
        ["ssh-keyscan", "-T", "10", "-t", "ed25519", *(lab.addr(n) for n in NODES)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (top / "known_hosts").write_text(scan.stdout)
    (top / "inventory").write_text(
        "[gb200_trays]\n"
        + "".join(f"{n} ansible_host={lab.addr(n)}\n" for n in NODES)
        + "\n[gb200_trays:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\n"
        + f"ansible_ssh_private_key_file={key}\n"
        + f"ansible_ssh_common_args='-o UserKnownHostsFile={top}/known_hosts -o StrictHostKeyChecking=yes'\n"
    )
    (top / "topology.conf").write_text(TOPOLOGY)
    variables = {
        "imexctl_package_file": str(deb),
        "imexctl_config": CONFIG,
        "imexctl_topology_src": str(top / "topology.conf"),
        "imexctl_rack_subnet": SUBNET,
        "imexctl_driver_version": DRIVER,
    }
    (top / "site-vars.json").write_text(json.dumps(variables, indent=1))
    return top


def playbook(site: Path, *extra: str) -> tuple[int, str, dict[str, dict[str, int]]]:
    """``ansible-playbook -i inventory deploy/ansible/site.yml -e @site-vars.json``: exit code, output, recap."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(site),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(site / "tmp"),
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    }
    argv = ["ansible-playbook", "-i", str(site / "inventory"), str(PLAYBOOK), "-e", f"@{site}/site-vars.json", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=site, check=False)
    recap = {
        m.group(1): dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()[1:])))
        for m in RECAP.finditer(done.stdout)
    }
    lines = [ln for ln in done.stdout.splitlines() if RECAP.match(ln)]
    print("\n".join(lines))
    return done.returncode, done.stdout + done.stderr, recap


def on(lab: SystemdLab, node: str, *argv: str) -> str:
    return str(lab.node(node).exec(list(argv), check=False).stdout.strip())


def test_the_role_installs_from_nothing_then_changes_nothing_and_a_job_gets_its_domain(
    lab: SystemdLab, site: Path
) -> None:
    """First run: changes, no failure; second run: changed=0; then a job on both nodes gets its domain UP,
    through the package's hooks, the role's config and topology.conf, and the role's firewall rule."""
    assert on(lab, "node1", "dpkg-query", "-W", "-f", "${Status}", "imexctl") != "install ok installed"
    code, out, first = playbook(site)
    assert code == 0, out[-6000:]
    assert set(first) == set(NODES) and all(r["changed"] > 0 and r["failed"] == 0 for r in first.values()), first
    code, out, second = playbook(site)
    assert code == 0, out[-6000:]
    assert all(r["changed"] == 0 and r["failed"] == 0 and r["unreachable"] == 0 for r in second.values()), out[-6000:]
    for node in NODES:
        _check_node(lab, node)
    _run_a_job(lab)
    for node in NODES:
        rule = on(lab, node, "nft", "list", "chain", "inet", "filter", "input")
        # both ranges, which nft shows merged (61000-62999) when they touch, as the defaults do
        found = re.search(r"ip saddr 198\.18\.4\.0/24 tcp dport \{ 61000-62999 \} counter packets (\d+) ", rule)
        assert found and int(found.group(1)) > 0, rule
        assert rule.index('comment "imexctl"') < rule.index("drop"), "the rule comes before the site's drop"


def _check_node(lab: SystemdLab, node: str) -> None:
    """What the role leaves on a node, each read from the node itself."""
    assert (
        on(lab, node, "dpkg-query", "-W", "-f", "${Status} ${Version}", "imexctl")
        == f"install ok installed {__version__}"
    )
    assert on(lab, node, "/opt/imexctl/bin/imexctl", "--version") == f"imexctl {__version__}"
    for d, name, hook in (("prolog.d", "00-imexctl", "prolog"), ("epilog.d", "99-imexctl", "epilog")):
        assert on(lab, node, "readlink", f"/etc/slurm/{d}/{name}") == f"/usr/share/imexctl/hooks/{hook}"
    conf = on(lab, node, "cat", "/etc/imexctl/imexctl.conf")
    assert "[paths]\nproc_devices = /etc/imexlab/devices\ntopology_file = /etc/slurm/topology.conf\n" in conf + "\n"
    assert on(lab, node, "cat", "/etc/slurm/topology.conf") == TOPOLOGY.strip()
    assert on(lab, node, "systemctl", "is-enabled", "nvidia-imex.service") == "masked"
    assert on(lab, node, "systemctl", "is-active", "nvidia-imex.service") == "inactive"
    assert on(lab, node, "systemctl", "is-enabled", "imexctl-cleanup.service") == "enabled"
    assert on(lab, node, "systemctl", "is-active", "imexctl-metrics.timer") == "active"
    assert on(lab, node, "dpkg", "--get-selections", "nvidia-imex").split() == ["nvidia-imex", "hold"]
    assert 'include "/etc/nftables.d/imexctl.nft"' in on(lab, node, "cat", "/etc/nftables.conf")
    guard = on(lab, node, "cat", "/etc/systemd/system/user.slice.d/imexctl-port-guard.conf")  # both ranges
    assert "[Slice]\nSocketBindDeny=tcp:61000-61999\nSocketBindDeny=tcp:62000-62999" in guard, guard
    assert not (lab.node_root(node) / "etc/systemd/system/slurmstepd.scope.d").exists()  # imexctl_port_guard_jobs
    shown = on(lab, node, "systemctl", "show", "--property=SocketBindDeny", "user.slice").splitlines()
    assert sorted(shown) == ["SocketBindDeny=tcp61000-61999", "SocketBindDeny=tcp62000-62999"], shown
    live = lab.node_root(node) / TEXTFILE_DIR.lstrip("/") / "imexctl-live.prom"
    wait_for(live.exists, 30, 0.5, what=f"{node}: the live gauges")


def _run_a_job(lab: SystemdLab) -> None:
    """A job on both nodes: the step sees its domain UP (nvidia-imex-ctl -N); afterwards nothing is left."""
    wrap = shlex.join(step_argv(lab, NODES, "--ctl", "/usr/bin/nvidia-imex-ctl", "--hold"))
    job = sbatch(lab, wrap, NODES)
    steps = wait_for(lambda: read_steps(lab, NODES), 90, 0.2, what=f"job {job}'s step on every node")
    for node in NODES:
        assert steps[node]["ctl"]["rc"] == 0, steps[node]
        assert_domain_up(json.loads(steps[node]["ctl"]["stdout"]), len(NODES), f"{node} (seen by the job step)")
        live = lab.node_root(node) / TEXTFILE_DIR.lstrip("/") / "imexctl-live.prom"
        wait_for(
            lambda live=live: f'imexctl_live_domain_owner_job{{block="r01"}} {job}' in live.read_text(),
            30,
            0.5,
            what="the live gauges",
        )
    release(lab, job)
    wait_done(lab, job)
    for node in NODES:
        assert not (lab.node_root(node) / f"run/imexctl/jobs/{job}").exists()


def test_the_role_never_writes_a_config_the_installed_imexctl_refuses(lab: SystemdLab, site: Path) -> None:
    """A value imexctl does not accept: the template's validate (imexctl preflight --config-only) fails the
    play on every node with imexctl's own line, and the file on the nodes stays as it was."""
    before = {n: on(lab, n, "cat", "/etc/imexctl/imexctl.conf") for n in NODES}
    bad = json.dumps({"imexctl_config": {**CONFIG, "policy": {"fabric": "sometimes"}}})
    code, out, recap = playbook(site, "-e", bad)
    assert code != 0 and set(recap) == set(NODES) and all(r["failed"] == 1 for r in recap.values()), out[-4000:]
    assert "[policy] fabric" in out and "preflight" in out, out[-4000:]
    assert {n: on(lab, n, "cat", "/etc/imexctl/imexctl.conf") for n in NODES} == before
