"""An upgrade that ``imexctl preflight`` refuses, on a booted Debian 13 node: apt goes on, and doctor, ``--version``,
the live gauge, its alert and the journal say which version is in use and why (issue 42).

Marker ``systemd``: a lab of its own (tests/lab/sysd.py, names ``imxup``, 198.18.7.0/24) boots a controller and
one node with systemd, slurmd and the stand-in NVIDIA side, without imexctl (``site_install=False``), as
tests/ansible/test_role.py does. The node gets, by ``apt-get install``, the .deb of this checkout for its Python
(``IMEXCTL_PYTHON``), a config that version reads (``[readiness] deadline_s = 90``), then a new Debian revision of
the same upstream version whose reader takes ``deadline_s`` up to 60 only (tests/test_packaging.py ``REVISION``):
its switch is refused. Prometheus' rules run in promtool over the live file the node then writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl import __version__
from tests.lab import debroot
from tests.lab.cluster import LabError, LabUnavailable
from tests.lab.nspawn import boot_problems, nspawn_problems
from tests.lab.sysd import SystemdLab
from tests.lab.versions import LabNames
from tests.support.ci import unavailable
from tests.test_packaging import CAPPED, REVISION

pytestmark = pytest.mark.systemd

REPO = Path(__file__).resolve().parents[2]
NAMES = LabNames(prefix="imxup", bridge="imxupbr0", subnet="198.18.7", ctl_port=6817, first_job_id=700000)
NODE = "node1"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
SWITCH = "/opt/imexctl/libexec/imexctl-switch"
CONFIG = f"""\
# the lab's (tests/lab/sysd.py) and the live gauges' directory; a deadline the revision's reader refuses
[paths]
proc_devices = /etc/imexlab/devices
[policy]
fabric = none
[metrics]
textfile_dir = {TEXTFILE_DIR}
[readiness]
deadline_s = {{deadline}}
"""
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def _tools() -> None:
    missing = [t for t in ("dpkg-buildpackage", "dpkg-deb", "promtool") if not shutil.which(t, path=ENV["PATH"])]
    if missing:
        unavailable(f"needs {', '.join(missing)} (bash .ci/setup test installs them)")


@pytest.fixture(scope="module")
def root() -> debroot.DebRoot:
    """The cached Debian 13 root the nodes boot (tests/lab/debroot.py)."""
    _tools()
    problems = nspawn_problems()
    if problems:
        unavailable(f"systemd lab unavailable: {'; '.join(problems)}")
    try:
        found = debroot.ensure_root(log=lambda msg: print(f"[debroot] {msg}", flush=True))
    except LabError as exc:
        unavailable(f"systemd lab unavailable: {exc}")
    problems = boot_problems(found.path, f"{NAMES.prefix}-probe")
    if problems:
        unavailable(f"systemd lab unavailable: {'; '.join(problems)}")
    return found


def _build(src: Path, version: str, pyver: str) -> Path:
    """dpkg-buildpackage in ``src`` for the nodes' Python; the .deb of ``version``."""
    env = {**ENV, "IMEXCTL_PYTHON": pyver}
    done = subprocess.run(
        ["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, capture_output=True, text=True, timeout=900, env=env,
        check=False,
    )  # fmt: skip
    if done.returncode != 0 and "NewConnectionError" in done.stdout + done.stderr:
        unavailable("pip cannot reach the package index for the .deb's dependencies")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (found,) = src.parent.glob(f"imexctl_{version}_*.deb")
    return found


def _checkout(dest: Path) -> Path:
    """This checkout's files (tracked or not, but not ignored) under ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name, follow_symlinks=False)
    return dest


@pytest.fixture(scope="module")
def debs(root: debroot.DebRoot, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The .deb of this checkout and of :data:`REVISION` (the capped reader), for the nodes' Python."""
    pyver = ".".join(str(root.info["python"]).split(".")[:2])
    old = _build(_checkout(tmp_path_factory.mktemp("old") / "imexctl"), __version__, pyver)
    src = _checkout(tmp_path_factory.mktemp("rev") / "imexctl")
    schema = src / "imexctl/config/schema.py"
    schema.write_text(schema.read_text().replace(*CAPPED))
    changelog = (src / "debian/changelog").read_text()
    trailer = next(line for line in changelog.splitlines() if line.startswith(" -- "))
    entry = f"imexctl ({REVISION}) unstable; urgency=medium\n\n  * deadline_s up to 60 (a test build).\n\n{trailer}\n\n"
    (src / "debian/changelog").write_text(entry + changelog)
    return {"old": old, "rev": _build(src, REVISION, pyver)}


@pytest.fixture(scope="module")
def lab(root: debroot.DebRoot, debs: dict[str, Path]) -> Iterator[SystemdLab]:
    """The controller and one booted node without imexctl; the packages in the shared directory."""
    lab = SystemdLab(root.path, 1, owner_pid=os.getpid(), names=NAMES, site_install=False)
    try:
        lab.up()
    except LabUnavailable as exc:
        unavailable(f"systemd lab unavailable: {exc}")
    try:
        for name, path in debs.items():
            shutil.copy(path, lab.dir / f"{name}.deb")
        _other_deb(lab.dir / "other.deb")
        yield lab
    finally:
        lab.down()


def _other_deb(out: Path) -> None:
    """A package of nothing, with no dependency, for apt-get to install after the refusal."""
    tree = out.parent / "other"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: imexctl-test-other\nVersion: 1\nArchitecture: all\nMaintainer: test <test@localhost>\n"
        "Description: another package (tests/upgrades/test_upgrade_booted.py)\n"
    )
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out)], check=True, timeout=120)


def apt(lab: SystemdLab, what: str) -> subprocess.CompletedProcess[str]:
    """``apt-get install -y`` of a .deb in the shared directory, as a site runs it: no terminal, no prompt."""
    argv = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", str(lab.dir / what)]
    return lab.node(NODE).exec(argv, check=False, timeout=300)  # type: ignore[no-any-return]


def configure(lab: SystemdLab, deadline: int) -> None:
    """The node's /etc/imexctl/imexctl.conf, root's, 0644."""
    conf = lab.node_root(NODE) / "etc/imexctl/imexctl.conf"
    conf.write_text(CONFIG.format(deadline=deadline))
    os.chmod(conf, 0o644)


def doctor_version(lab: SystemdLab) -> dict[str, str]:
    """imexctl doctor's imexctl.version on the node."""
    done = lab.imexctl(NODE, "doctor", "--json")
    (check,) = [c for c in json.loads(done.stdout)["data"] if c["name"] == "imexctl.version"]
    return dict(check)


def pending_gauge(lab: SystemdLab) -> dict[tuple[str, str, str], float]:
    """A refresh of the live gauges by their unit, as the timer starts it; the version gauge's samples."""
    lab.node(NODE).exec(["systemctl", "start", "imexctl-metrics.service"], timeout=120)
    text = (lab.node_root(NODE) / TEXTFILE_DIR.lstrip("/") / "imexctl-live.prom").read_text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "imexctl_live_version_pending":
                out[(s.labels["active"], s.labels["installed"], s.labels["reason"])] = float(s.value)
    return out


def test_a_refused_upgrade_keeps_apt_working_and_says_why_everywhere(lab: SystemdLab, tmp_path: Path) -> None:
    """apt-get installs the refused revision (exit 0) and then another package (exit 0); the version in use stays and
    still reads the config; doctor FAILs naming both versions and why, --version says the same, the live gauge is 1
    with both versions and ``config``, ImexctlUpgradeRefused fires on it, the journal has package.switch_refused.
    Once the config is fixed the switch run by hand completes the upgrade, and each says so."""
    m = lab.node(NODE)
    root = lab.node_root(NODE)
    (root / TEXTFILE_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    done = apt(lab, "old.deb")
    assert done.returncode == 0, done.stdout + done.stderr
    configure(lab, 90)
    assert pending_gauge(lab) == {(__version__, __version__, ""): 0.0}
    done = apt(lab, "rev.deb")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith(f"imexctl {REVISION}:")]
    assert line.startswith(f"imexctl {REVISION}: not switched to; the hooks keep running versions/{__version__} (")
    assert (
        m.exec(["dpkg-query", "-W", "-f", "${Status} ${Version}", "imexctl"]).stdout
        == f"install ok installed {REVISION}"
    )
    done = apt(lab, "other.deb")
    assert done.returncode == 0, done.stdout + done.stderr
    assert m.exec(["dpkg", "--audit"]).stdout == ""
    # the version in use is the old one, whole: it still reads the config
    assert os.readlink(root / "opt/imexctl/current") == f"versions/{__version__}"
    assert lab.imexctl(NODE, "preflight").returncode == 0
    reason = line.split(" (", 1)[1].removesuffix(f"); fix it, then run {SWITCH}")
    assert "deadline_s" in reason
    assert lab.imexctl(NODE, "--version").stdout.strip() == (
        f"imexctl {__version__} (active; {REVISION} installed, refused: {reason})"
    )
    check = doctor_version(lab)
    assert check["status"] == "FAIL", check
    assert check["message"].startswith(f"{REVISION} is installed but not in use: its switch was refused ")
    assert f"the new version cannot read the tray's config ({reason}); the hooks run {__version__}" in check["message"]
    assert check["fix"].startswith(f"fix what it names, then run {SWITCH}")
    samples = pending_gauge(lab)
    assert samples == {(__version__, REVISION, "config"): 1.0}
    _alert_fires(tmp_path, samples)
    journal = m.exec(["journalctl", "-t", "imexctl", "-o", "cat", "--no-pager"]).stdout.splitlines()
    refused = [json.loads(ln) for ln in journal if '"package.switch_refused"' in ln]
    assert refused and refused[-1]["version"] == REVISION and refused[-1]["active"] == __version__, journal
    assert refused[-1]["why"] == "config" and refused[-1]["reason"] == reason
    # fixed: the switch by hand completes the upgrade
    configure(lab, 60)
    done = m.exec([SWITCH], check=False)
    assert (
        done.returncode == 0
        and done.stdout.strip() == f"imexctl {REVISION}: in use (the hooks ran versions/{__version__})"
    )
    assert lab.imexctl(NODE, "--version").stdout.strip() == f"imexctl {REVISION}"
    assert doctor_version(lab)["status"] == "OK"
    assert pending_gauge(lab) == {(REVISION, REVISION, ""): 0.0}


def _alert_fires(tmp_path: Path, samples: dict[tuple[str, str, str], float]) -> None:
    """promtool runs the shipped rules over the node's samples, scraped every minute: ImexctlUpgradeRefused fires
    with the version in use, the installed one and why."""
    series = [
        f'      - series: \'imexctl_live_version_pending{{instance="{NODE}", block="", active="{a}", '
        f'installed="{i}", reason="{r}"}}\'\n        values: \'{int(v)}x10\'\n'
        for (a, i, r), v in samples.items()
    ]
    (a, i, r) = next(iter(samples))
    test = (
        f"rule_files:\n  - {REPO}/pkg/prometheus/imexctl.rules.yml\nevaluation_interval: 1m\ntests:\n"
        "  - interval: 1m\n    input_series:\n" + "".join(series) + "    alert_rule_test:\n"
        "      - eval_time: 5m\n        alertname: ImexctlUpgradeRefused\n        exp_alerts:\n"
        f"          - exp_labels: {{severity: warning, instance: {NODE}, active: {a}, installed: {i}, reason: {r}}}\n"
        "            exp_annotations:\n"
        '              runbook_url: "https://github.com/imexctl/imexctl/blob/main/docs/troubleshooting.md#doctor_failed"\n'
        f'              summary: "{NODE} runs imexctl {a}: {i} is installed, not in use ({r})"\n'
        '              description: "Jobs run on with the version in use. `imexctl doctor` there (imexctl.version) and '
        "`imexctl --version` say why the switch was refused; fix that, then run "
        '/opt/imexctl/libexec/imexctl-switch there."\n'
    )
    (tmp_path / "upgrade_test.yml").write_text(test)
    done = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "upgrade_test.yml")], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
