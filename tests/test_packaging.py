"""Packages: the wheel and sdist, the .deb installed into a clean Debian root, the .rpm's files and scriptlets.

Marked ``packaging`` (``pytest -m packaging`` runs only these; they build in a
few tens of seconds once pip's cache and the clean root exist).  They need
root, dpkg-buildpackage, debhelper, rpmbuild and debootstrap (``.ci/setup
test`` installs them), the package index for the dependencies' wheels and the
Debian mirror; each test that lacks one says which and is skipped, or fails
under ``CI=true`` (tests/support/ci.py).  What is and is not verified for the
RPM: docs/install.md, "The RPM".
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl import __version__
from tests.lab.debroot import plain_root
from tests.lab.procs import LabError
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parent.parent
SYS_PYTHON = "/usr/bin/python3"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root")}
SUITE = "bookworm"
ROOT_PACKAGES = ("python3",)
#: what both packages install (pkg/stage.py), besides the units (Debian: /lib, EL9: /usr/lib) and the man page
#: (the Python environment in packaged/<version>, the entry points that lead to the version in use); <version> is
#: the package's whole version: the .deb's (debian/changelog, native: imexctl's own), the RPM's with its release
PACKAGED = f"/opt/imexctl/packaged/{__version__}"
RPM_PACKAGED = f"/opt/imexctl/packaged/{__version__}-1"
LAYOUT = (
    "/opt/imexctl/bin/imexctl",
    "/opt/imexctl/bin/python3",
    "/opt/imexctl/bin/python",
    "/opt/imexctl/libexec/imexctl-switch",
    f"{PACKAGED}/pyvenv.cfg",
    f"{PACKAGED}/BUILD",
    f"{PACKAGED}/bin/imexctl",
    "/usr/sbin/imexctl",
    "/usr/share/imexctl/hooks/prolog",
    "/usr/share/imexctl/hooks/epilog",
    "/usr/share/imexctl/hooks/health",
    "/usr/share/imexctl/hooks/task-prolog",
    "/usr/share/imexctl/hooks/enroot/99-imexctl.sh",
    "/etc/imexctl/imexctl.conf",
    "/usr/share/imexctl/imexctl.conf.example",
    "/usr/share/imexctl/systemd/no-hardening.conf",
    "/usr/share/imexctl/systemd/port-guard.slice.conf",
    "/usr/share/imexctl/systemd/port-guard.scope.conf",
    "/usr/share/imexctl/prometheus/imexctl.rules.yml",
    "/usr/share/imexctl/prometheus/alertmanager.yml",
    "/usr/share/imexctl/prometheus/imexctl.dashboard.json",
    "/usr/share/imexctl/dcgm/dcgmi-health.txt",
    "/usr/share/imexctl/dcgm/dcgm-exporter-counters.csv",
    "/usr/share/imexctl/dcgm/nvsentinel-values.yaml",
    "/usr/share/doc/imexctl/README.md",
    "/usr/share/doc/imexctl/docs/install.md",
    "/usr/share/doc/imexctl/docs/configuration.md",
    "/etc/logrotate.d/imexctl",
    "/etc/nhc/scripts/imexctl.nhc",
)
UNITS = ("imexctl-imex@.service", "imexctl-cleanup.service", "imexctl-metrics.service", "imexctl-metrics.timer")
#: imexctl's and its bundled dependencies' (debian/copyright has one paragraph each)
RPM_LICENSE = "Apache-2.0 AND (MIT OR Apache-2.0) AND BSD-3-Clause AND PSF-2.0 AND MIT"
#: imexctl-cleanup.service's [Install] WantedBy=: where systemctl enable links it
REQUIRED_BY = ("multi-user.target.wants", "slurmd.service.wants")


def sh(argv: list[str], *, cwd: Path | None = None, timeout: float = 600, check: bool = True, **kw: object) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV, check=False, **kw)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t, path=ENV["PATH"]) is None]
    if missing:
        unavailable(f"needs {', '.join(missing)} (bash .ci/setup test installs them)")


def _pip_problem(output: str) -> str:
    """Why pip could not reach the package index, or '' when that was not the problem."""
    for marker in ("NewConnectionError", "Temporary failure in name resolution", "No matching distribution"):
        if marker in output:
            return marker
    return ""


def _copy_checkout(src: Path) -> Path:
    """The checkout's files as they are now (tracked or not, but not ignored) under ``src``."""
    files = sh(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name, follow_symlinks=False)
    return src


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built from this checkout by setuptools' PEP 517 backend."""
    out = tmp_path_factory.mktemp("dist")
    src = _copy_checkout(tmp_path_factory.mktemp("src") / "imexctl")
    # the backend rewrites sys.argv: keep the directory first
    code = "import sys; from setuptools import build_meta as b; d = sys.argv[1]; b.build_sdist(d); b.build_wheel(d)"
    sh([SYS_PYTHON, "-c", code, str(out)], cwd=src)
    return out


def test_wheel_holds_the_package_and_no_tests(dist: Path) -> None:
    """The wheel is imexctl's only: the package (with sim/ and py.typed), the scripts, no tests."""
    wheel = dist / f"imexctl-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"imexctl", f"imexctl-{__version__}.dist-info"}
    assert {"imexctl/cli/__init__.py", "imexctl/doctor/checks.py", "imexctl/sim/daemon.py", "imexctl/py.typed"} <= set(
        names
    )
    entry = zipfile.ZipFile(wheel).read(f"imexctl-{__version__}.dist-info/entry_points.txt").decode()
    assert "imexctl = imexctl.cli:console" in entry
    assert [n for n in names if n.startswith(f"imexctl-{__version__}.dist-info/") and n.endswith("/LICENSE")]


def test_sdist_holds_what_the_packages_are_built_from(dist: Path) -> None:
    """The sdist has the package, debian/, pkg/, hooks, units, docs and the Ansible role; no tests."""
    with tarfile.open(dist / f"imexctl-{__version__}.tar.gz") as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {"debian/rules", "debian/control", "pkg/stage.py", "pkg/rpm/imexctl.spec", "pkg/logrotate"}
    wanted |= {
        "hooks/prolog",
        "systemd/imexctl-imex@.service",
        "docs/operations.md",
        "imexctl/cli/__init__.py",
        "LICENSE",
        "deploy/ansible/site.yml",
        "deploy/ansible/roles/imexctl/tasks/main.yml",
    }
    assert wanted <= names
    assert not [n for n in names if n.startswith(("tests/", "bench/", ".ci/"))]


def test_versions_come_from_one_place() -> None:
    """debian/changelog and the RPM spec carry imexctl/__init__.py's version."""
    first = (REPO / "debian/changelog").read_text().splitlines()[0]
    assert first.startswith(f"imexctl ({__version__}) ")
    assert f"\nVersion:        {__version__}\n" in (REPO / "pkg/rpm/imexctl.spec").read_text()


def test_wheel_in_a_fresh_venv_runs_version_and_demo(dist: Path, tmp_path: Path) -> None:
    """pip installs the wheel into a new venv, where imexctl --version and imexctl demo work."""
    if os.geteuid() != 0:
        unavailable("imexctl demo runs the real hooks, which need root")
    venv = tmp_path / "venv"
    sh([SYS_PYTHON, "-m", "venv", str(venv)])
    wheel = dist / f"imexctl-{__version__}-py3-none-any.whl"
    done = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=600, env=ENV, check=False,
    )  # fmt: skip
    if done.returncode != 0 and _pip_problem(done.stderr):
        unavailable(f"pip cannot reach the package index for the dependencies: {_pip_problem(done.stderr)}")
    assert done.returncode == 0, done.stderr
    assert sh([str(venv / "bin/imexctl"), "--version"]).strip() == f"imexctl {__version__}"
    out = sh([str(venv / "bin/imexctl"), "demo", "--trays", "2"], timeout=300, cwd=tmp_path)
    assert "after the epilogs: nothing left (no daemon, no file, no channel)" in out


# ---------------------------------------------------------------- the bundled environment


def _stage(dest: Path, pyver: str, *extra: str) -> None:
    """pkg/stage.py into ``dest`` for CPython ``pyver`` on this machine (the step both packages build with)."""
    argv = [SYS_PYTHON, "pkg/stage.py", "--destdir", str(dest), "--python-version", pyver, *extra]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV, check=False)
    if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
        unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
    assert done.returncode == 0, done.stdout + done.stderr


def _digests(root: Path) -> dict[str, str]:
    """Every file and link under root: its sha256, or where a link points."""
    out = {}
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _bundled_versions(paths: Iterator[str] | set[str]) -> dict[str, str]:
    """``{name: version}`` from the ``*.dist-info`` directories among paths (imexctl's own left out)."""
    found = (re.search(r"site-packages/([^/]+)-([^-/]+)\.dist-info(/|$)", p) for p in paths)
    out = {m.group(1).lower().replace("_", "-"): m.group(2) for m in found if m}
    out.pop("imexctl", None)
    return out


def _locked_versions(pyver: str | None = None) -> dict[str, str]:
    """The lock's pins for CPython ``pyver`` (its markers judged), or for every target."""
    sys.path.insert(0, str(REPO / "pkg"))
    import wheels

    return wheels.pins() if pyver is None else wheels.pins_for(pyver)


def test_two_builds_give_the_same_files_and_locked_versions(tmp_path: Path) -> None:
    """Staged twice, the environment is byte for byte the same, bundles the lock's versions for EL9's 3.9 as
    for this machine's Python, and records no build path (no direct_url.json)."""
    pyver = (
        "{}.{}".format(*sys.version_info[:2])
        if Path(SYS_PYTHON).resolve() == Path(sys.executable).resolve()
        else "3.11"
    )
    _stage(tmp_path / "one", pyver)
    _stage(tmp_path / "two", pyver)
    _stage(tmp_path / "el9", "3.9")
    one, two = _digests(tmp_path / "one"), _digests(tmp_path / "two")
    assert sorted(one) == sorted(two)
    assert one == two
    assert _bundled_versions(set(one)) == _locked_versions(pyver)
    assert _bundled_versions(set(_digests(tmp_path / "el9"))) == _locked_versions("3.9")
    assert "tomli" in _locked_versions("3.9") and "tomli" not in _locked_versions("3.11")
    assert not [p for p in one if p.endswith("direct_url.json")]
    leaked = [p for p in one if "dist-info/" in p and str(tmp_path).encode() in (tmp_path / "one" / p).read_bytes()]
    assert not leaked


def test_offline_build_from_the_documented_wheelhouse(tmp_path: Path) -> None:
    """pkg/wheels.py download fetches the locked wheels; stage.py --wheels then builds without the index."""
    done = subprocess.run(
        [SYS_PYTHON, "pkg/wheels.py", "download", str(tmp_path / "wheels")],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV, check=False,
    )  # fmt: skip
    if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
        unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
    assert done.returncode == 0, done.stdout + done.stderr
    fetched = {p.name.split("-")[0].lower().replace("_", "-") for p in (tmp_path / "wheels").glob("*.whl")}
    assert fetched == set(_locked_versions())
    _stage(tmp_path / "root", "3.9", "--arch", "aarch64", "--wheels", str(tmp_path / "wheels"))
    assert _bundled_versions(set(_digests(tmp_path / "root"))) == _locked_versions("3.9")


# ---------------------------------------------------------------- the .deb


#: the version of the second .deb, which upgrades the first
NEXT = f"{__version__}+next1"


def _unpacked_sdist(dist: Path, where: str) -> Path:
    with tarfile.open(dist / f"imexctl-{__version__}.tar.gz") as tar:
        tar.extractall(dist / where)  # noqa: S202 # our own sdist
    return dist / where / f"imexctl-{__version__}"


def _build_deb(src: Path, version: str) -> Path:
    """dpkg-buildpackage in an unpacked sdist: the one .deb of ``version`` beside it."""
    if os.geteuid() != 0:
        unavailable("dpkg-buildpackage here runs as root (bash .ci/setup test)")
    _need("dpkg-buildpackage", "dh", "fakeroot")
    done = subprocess.run(
        ["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, capture_output=True, text=True, timeout=900, env=ENV,
        check=False,
    )  # fmt: skip
    if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
        unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    found = sorted(src.parent.glob(f"imexctl_{version}_*.deb"))
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def deb(dist: Path) -> Path:
    """The .deb, built by dpkg-buildpackage from the unpacked sdist."""
    return _build_deb(_unpacked_sdist(dist, "deb"), __version__)


@pytest.fixture(scope="module")
def deb_next(dist: Path) -> Path:
    """A .deb of the next version (NEXT in imexctl/__init__.py and debian/changelog), with one change inside.

    As between real releases, a module of NEXT needs what only NEXT's other
    modules have: ``hooks/readiness.py``, which a prolog imports only once it
    has started the daemon, imports a name that only NEXT's
    ``platform/__init__.py`` defines.  A hook that read ``platform`` from one
    version and ``readiness`` from the other fails (ImportError, exit 70).
    """
    src = _next_tree(_unpacked_sdist(dist, "deb-next"))
    _changelog(src, NEXT, "The next release (a test build).")
    return _build_deb(src, NEXT)


def _changelog(src: Path, version: str, what: str) -> None:
    """A debian/changelog entry of ``version`` on top of the unpacked sdist's."""
    changelog = (src / "debian/changelog").read_text()
    trailer = next(line for line in changelog.splitlines() if line.startswith(" -- "))
    entry = f"imexctl ({version}) unstable; urgency=medium\n\n  * {what}\n\n{trailer}\n\n"
    (src / "debian/changelog").write_text(entry + changelog)


#: a new Debian revision (an RPM release) of imexctl's own version, whose reader takes [readiness] deadline_s up to
#: 60 only, as a revision that carries a fix may: the config ``deadline_s = 90``, which the version in use reads,
#: is one it refuses
REVISION = f"{__version__}-2"
CAPPED = ('"deadline_s": ("60", _number(float, 0.1, 3600)),', '"deadline_s": ("60", _number(float, 0.1, 60)),')


def _capped_tree(src: Path) -> Path:
    """An unpacked sdist whose reader refuses ``[readiness] deadline_s`` above 60 (:data:`REVISION`)."""
    schema = src / "imexctl/config/schema.py"
    text = schema.read_text()
    assert CAPPED[0] in text
    schema.write_text(text.replace(*CAPPED))
    return src


@pytest.fixture(scope="module")
def deb_rev(dist: Path) -> Path:
    """A .deb of :data:`REVISION`: imexctl's own version, a new Debian revision, the capped reader."""
    src = _capped_tree(_unpacked_sdist(dist, "deb-rev"))
    _changelog(src, REVISION, "A new revision: [readiness] deadline_s up to 60 (a test build).")
    return _build_deb(src, REVISION)


@pytest.fixture(scope="module")
def deb_rebuilt(dist: Path) -> Path:
    """A .deb of imexctl's own version again, built from other contents (the capped reader)."""
    return _build_deb(_capped_tree(_unpacked_sdist(dist, "deb-rebuilt")), __version__)


def _next_tree(src: Path) -> Path:
    """An unpacked sdist made NEXT: its version, and the change inside that :func:`deb_next` describes."""
    init = src / "imexctl/__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', f'__version__ = "{NEXT}"'))
    record = src / "imexctl/platform/__init__.py"
    record.write_text(
        record.read_text() + "\n#: only the next release has it (tests/test_packaging.py)\nNEXT_ONLY = True\n"
    )
    readiness = src / "imexctl/hooks/readiness.py"
    text = readiness.read_text()
    readiness.write_text(
        text.replace(
            "from imexctl.platform import Record\n",
            "from imexctl.platform import NEXT_ONLY, Record  # noqa: F401\n",
            1,
        )
    )
    assert "NEXT_ONLY" in readiness.read_text()
    return src


def test_deb_control_and_files(deb: Path) -> None:
    """The .deb depends on the build's Python minor, marks the configs as conffiles and ships the layout."""
    info = sh(["dpkg-deb", "-f", str(deb), "Depends", "Version", "Architecture"])
    relations = sh(["dpkg-deb", "-f", str(deb), "Recommends", "Suggests"])
    assert "Recommends" not in relations and "logrotate" in relations, "logrotate is only suggested"
    minor = sys.version_info[:2] if Path(SYS_PYTHON).resolve() == Path(sys.executable).resolve() else None
    assert f"Version: {__version__}" in info and "python3 (>= 3." in info and "python3 (<< 3." in info
    if minor:
        assert f"python3 (>= {minor[0]}.{minor[1]})" in info
    files = {f.removeprefix(".") for f in _deb_files(deb)}
    wanted = {*LAYOUT, "/usr/share/man/man8/imexctl.8.gz", "/usr/share/man/man5/imexctl.conf.5.gz"}
    wanted |= {f"/lib/systemd/system/{unit}" for unit in UNITS}
    assert wanted <= files
    assert not [f for f in files if "/etc/systemd/" in f or "/tests/" in f or f.endswith(".pyc")]
    assert not [f for f in files if _simulator(f)], "the simulator and the demo stay off the nodes"
    conffiles = sh(["dpkg-deb", "--info", str(deb), "conffiles"]).split()
    assert conffiles == ["/etc/imexctl/imexctl.conf", "/etc/logrotate.d/imexctl", "/etc/nhc/scripts/imexctl.nhc"]


def _bundled_metadata(deb: Path) -> dict[str, str]:
    """Each bundled distribution's METADATA in the .deb, by distribution name (imexctl's own left out)."""
    tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True, timeout=120)
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes.stdout)) as tar:
        for member in tar.getmembers():
            if member.name.endswith(".dist-info/METADATA") and "/site-packages/" in member.name:
                text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                name = re.search(r"^Name: (.+)$", text, re.MULTILINE).group(1).strip()  # type: ignore[union-attr]
                if name != "imexctl":
                    out[name] = text
    return out


def _licenses(expression: str) -> set[str]:
    """``MIT OR Apache-2.0`` (PEP 639) or ``Apache-2.0 or MIT`` (DEP-5) as a set of lower-case names."""
    return {part.strip().lower().replace(" ", "-") for part in re.split(r"\s+or\s+", expression, flags=re.IGNORECASE)}


#: lintian's findings that debian/imexctl.lintian-overrides does not cover, with why they stay: the
#: maintainer address is imexctl@localhost until the project names a real one
LINTIAN_PENDING = {"bogus-mail-host", "bogus-mail-host-in-debian-changelog"}


def test_lintian_reports_only_the_overridden_tags(deb: Path) -> None:
    """lintian finds no error or warning but those debian/imexctl.lintian-overrides keeps with a reason."""
    _need("lintian")
    done = subprocess.run(
        ["lintian", "--tag-display-limit", "0", "--fail-on", "none", str(deb)],
        capture_output=True, text=True, timeout=600, env=ENV, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = {line.split()[2] for line in done.stdout.splitlines() if line.startswith(("E: ", "W: "))}
    assert found <= LINTIAN_PENDING, done.stdout


def test_deb_and_rpm_bundle_the_locked_versions(deb: Path, rpms: dict[str, Path]) -> None:
    """The .deb and both RPMs carry exactly pkg/requirements.lock's versions for their Python (tomli below 3.11)."""
    files = {f.removeprefix(".") for f in _deb_files(deb)}
    assert _bundled_versions(files) == _locked_versions(_site_python(files))
    for rpm in rpms.values():
        files = set(_rpm(rpm, "-l").splitlines())
        assert _site_python(files) == "3.9"
        assert _bundled_versions(files) == _locked_versions("3.9")


def _site_python(paths: set[str]) -> str:
    """The X.Y of the one ``lib/pythonX.Y/site-packages`` among paths."""
    (found,) = {m.group(1) for p in paths if (m := re.search(r"/lib/python(3\.[0-9]+)/site-packages/", p))}
    return found


def test_deb_copyright_covers_every_bundled_distribution(deb: Path) -> None:
    """debian/copyright has a paragraph for each distribution in the .deb's environment, with its license."""
    paragraphs = (REPO / "debian/copyright").read_text().split("\n\n")
    by_dist = {}
    for paragraph in paragraphs:
        found = re.search(r"^Comment: distribution (\S+) ", paragraph, re.MULTILINE)
        if found:
            by_dist[found.group(1)] = re.search(r"^License: (.+)$", paragraph, re.MULTILINE).group(1)  # type: ignore[union-attr]
    bundled = _bundled_metadata(deb)
    assert set(bundled) == set(by_dist)
    for name, metadata in bundled.items():
        declared = re.search(r"^License(?:-Expression)?: (.+)$", metadata, re.MULTILINE).group(1)  # type: ignore[union-attr]
        if declared == "BSD":  # nvidia-ml-py: the 3-clause text is at the head of pynvml.py
            assert by_dist[name] == "BSD-3-clause"
        else:
            assert _licenses(declared) == _licenses(by_dist[name]), name
    assert "./usr/share/doc/imexctl/copyright" in _deb_files(deb)


def _simulator(path: str) -> bool:
    return "/imexctl/sim/" in path or path.endswith(("/imexctl/commands/demo.py", "-sim"))


def _deb_files(deb: Path) -> set[str]:
    return {line.split()[5] for line in sh(["dpkg-deb", "-c", str(deb)]).splitlines()}


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A throw-away copy of the clean root."""
    if os.geteuid() != 0:
        unavailable("chroot and debootstrap need root")
    _need("debootstrap", "chroot", "unshare")
    try:
        # a Debian 12 minbase root with python3, built once by debootstrap and cached (tests copy it)
        base = plain_root("pkgroot", SUITE, ROOT_PACKAGES)
    except LabError as exc:
        if "Temporary failure" in str(exc) or "Failure trying to run" in str(exc) or "Couldn't download" in str(exc):
            unavailable(f"debootstrap cannot reach the Debian mirror: {str(exc).splitlines()[-1]}")
        raise
    copy = tmp_path / "root"
    sh(["cp", "-a", "--reflink=auto", str(base), str(copy)], timeout=300)
    yield copy
    shutil.rmtree(copy, ignore_errors=True)


def chroot(root: Path, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a shell script in the root, with /proc mounted in a mount namespace of its own."""
    argv = ["unshare", "--mount", "--fork", "sh", "-c", 'mount -t proc proc "$0/proc" && exec chroot "$0" sh -c "$1"']
    # stdin is /dev/null, as under clush, pdsh or Ansible: a prompt fails instead of waiting
    done = subprocess.run(
        [*argv, str(root), script], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV,
        check=False,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"in the root: {script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def _tree(root: Path) -> set[str]:
    """Every path in the root, but dpkg's and apt's own records, logs and caches."""
    skip = ("var/lib/dpkg/", "var/log/", "var/cache/", "tmp/", "proc/", "run/")
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            path = os.path.normpath(os.path.join(rel, name))
            if not path.startswith(skip):
                out.add(path)
    return out


def test_deb_installs_runs_removes_and_purges_cleanly(deb: Path, root: Path) -> None:
    """In a clean Debian 12 root: dpkg -i; --version, doctor and the hooks' paths work; remove and purge leave nothing."""
    before = _tree(root)
    shutil.copy(deb, root / "tmp/imexctl.deb")
    chroot(root, "dpkg -i /tmp/imexctl.deb")
    assert chroot(root, "/opt/imexctl/bin/imexctl --version").stdout.strip() == f"imexctl {__version__}"
    assert chroot(root, "imexctl --version").stdout.strip() == f"imexctl {__version__}"  # /usr/sbin on PATH
    doctor = chroot(root, "imexctl doctor --json", check=False)
    assert doctor.returncode == 1, doctor.stderr  # no NVIDIA driver, no slurm.conf in the root: FAILs, no crash
    checks = {c["name"]: c["status"] for c in json.loads(doctor.stdout)["data"]}
    assert checks["imexctl.config"] == "OK" and checks["imex.binaries"] == "FAIL"
    # each hook execs the installed imexctl: without slurmd's environment the prolog exits 65 (job_env_invalid)
    for hook, code in (("prolog", 65), ("epilog", 65)):
        ran = chroot(root, f"env -i /usr/share/imexctl/hooks/{hook}", check=False)
        assert ran.returncode == code, ran.stderr
        assert '"error_code": "job_env_invalid"' in ran.stderr
    # the health check (no arguments, no PATH): no NVIDIA driver here is a fault of the tray; no slurmctld to tell
    health = chroot(root, "env -i /usr/share/imexctl/hooks/health", check=False)
    assert health.returncode == 1 and " gpu_failed: NVML" in health.stdout.splitlines()[0], health.stdout
    demo = chroot(root, "imexctl demo", check=False)
    assert demo.returncode == 69 and "the simulator is not installed here" in demo.stderr
    assert not (root / "etc/systemd/system/multi-user.target.wants/imexctl-cleanup.service").exists()
    assert list((root / f"opt/imexctl/versions/{__version__}/lib").rglob("__pycache__/*.pyc")), "compiled at the switch"
    assert os.readlink(root / "opt/imexctl/current") == f"versions/{__version__}"
    # /opt/imexctl/bin/python (the enroot hook's, the TaskProlog's) is the version in use, found once
    code = "import sys, imexctl; print(sys.prefix, imexctl.__file__)"
    prefix, module = chroot(root, f"/opt/imexctl/bin/python -I -c '{code}'").stdout.split()
    assert prefix == f"/opt/imexctl/versions/{__version__}" and module.startswith(f"{prefix}/lib/python3.")
    chroot(root, "dpkg -r imexctl")
    assert not (root / "opt/imexctl").exists()
    assert (root / "etc/imexctl/imexctl.conf").exists(), "remove keeps the conffiles"
    chroot(root, "dpkg -P imexctl")
    assert chroot(root, "dpkg-query -W imexctl", check=False).returncode != 0
    after = _tree(root)
    assert (after - before, before - after) == (set(), set()), "purge leaves nothing behind and takes nothing else"
    assert not (root / "var/log/imexctl.log").exists()


def test_deb_install_enable_edit_upgrade_purge_unattended(deb: Path, deb_next: Path, root: Path) -> None:
    """Install, enable as documented, edit, upgrade with no terminal, purge: nothing asked, the edit kept, nothing left."""
    _need("systemctl")
    before = _tree(root)
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_next, root / "tmp/new.deb")
    chroot(root, "dpkg -i /tmp/old.deb")
    # docs/install.md: systemctl enable imexctl-cleanup.service (the root has no systemd: --root makes the same links)
    sh(["systemctl", f"--root={root}", "enable", "imexctl-cleanup.service"])
    links = [root / "etc/systemd/system" / wants / "imexctl-cleanup.service" for wants in REQUIRED_BY]
    # docs/metrics.md: systemctl enable --now imexctl-metrics.timer (the live gauges)
    sh(["systemctl", f"--root={root}", "enable", "imexctl-metrics.timer"])
    links.append(root / "etc/systemd/system/timers.target.wants/imexctl-metrics.timer")
    assert all(link.is_symlink() for link in links)
    conf = root / "etc/imexctl/imexctl.conf"
    edited = conf.read_text() + "\n[readiness]\ndeadline_s = 90\n"
    conf.write_text(edited)
    # as clush, pdsh, Ansible or BCM run it: no terminal, stdin /dev/null (chroot), no --force-conf* flag
    upgrade = chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/new.deb", check=False)
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert "Configuration file" not in upgrade.stdout + upgrade.stderr, "dpkg came to its conffile prompt"
    status = chroot(root, "dpkg-query -W -f '${Status} ${Version}' imexctl").stdout
    assert status == f"install ok installed {NEXT}", "the new postinst ran (configured, not left unpacked)"
    assert list((root / f"opt/imexctl/versions/{NEXT}/lib").rglob("__pycache__/*.pyc")), "the new postinst switched"
    assert conf.read_text() == edited
    assert sorted(p.name for p in conf.parent.iterdir()) == ["imexctl.conf"], "no .dpkg-dist or .dpkg-new beside it"
    assert chroot(root, "imexctl --version").stdout.strip() == f"imexctl {NEXT}"
    assert all(link.is_symlink() for link in links), "the upgrade keeps the unit enabled"
    chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -P imexctl")
    assert not [link for link in links if link.is_symlink()], "purge removes the enable links"
    after = _tree(root)
    assert (after - before, before - after) == (set(), set()), "purge leaves nothing behind and takes nothing else"


def test_deb_upgrade_over_itself_keeps_a_changed_config(deb: Path, root: Path) -> None:
    """Reinstalling (an upgrade in place) keeps the admin's edit of the config, asks nothing and recompiles the byte-code."""
    shutil.copy(deb, root / "tmp/imexctl.deb")
    chroot(root, "dpkg -i /tmp/imexctl.deb")
    conf = root / "etc/imexctl/imexctl.conf"
    conf.write_text(conf.read_text() + "\n[readiness]\ndeadline_s = 90\n")
    chroot(root, "dpkg -i /tmp/imexctl.deb")
    assert conf.read_text().endswith("\n[readiness]\ndeadline_s = 90\n")
    assert list((root / f"opt/imexctl/versions/{__version__}/lib").rglob("__pycache__/*.pyc"))
    assert chroot(root, "imexctl --version").stdout.strip() == f"imexctl {__version__}"


# ---------------------------------------------------------------- upgrades while hooks run

#: where the simulated trays live in the root, and their loopback addresses (not the demo's 127.0.0.x)
RACK = "/var/tmp/rack"
RACK_NET = "127.0.35"
SIM_PROC_DEVICES = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\nBlock devices:\n  8 sd\n"
#: runs in the root (stdlib only): ``loop RACK TRAYS`` runs jobs on every tray, prologs then epilogs, each
#: hook as slurmd does (the installed hooks/<hook>, no PATH), until RACK/stop exists, and records every hook
#: in RACK/results.jsonl with the version link before and after it; ``once RACK TRAYS HOOK JOB`` runs one hook
HOOKS = r"""
import json, os, subprocess, sys


def env(rack, tray, trays, job, hook):
    nodes = "tray[%s-%s]" % (trays[0][4:], trays[-1][4:]) if len(trays) > 1 else trays[0]
    return {
        "SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes,
        "SLURMD_NODENAME": tray, "SLURM_JOB_UID": "65534", "SLURM_JOB_GID": "65534", "SLURM_JOB_USER": "demo",
        "SLURM_JOB_PARTITION": "nvl72", "SLURM_CLUSTER_NAME": "test", "SLURM_SCRIPT_CONTEXT": hook + "_slurmd",
        "IMEXCTL_CONFIG": "%s/%s.conf" % (rack, tray),
    }


def run(rack, trays, hook, job):
    procs = [
        (t, subprocess.Popen(["/usr/share/imexctl/hooks/" + hook], env=env(rack, t, trays, job, hook), cwd="/",
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for t in trays
    ]
    return [(t, p.communicate()[0].decode(errors="replace"), p.returncode) for t, p in procs]


mode, rack, trays = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if mode == "once":
    ((_, text, rc),) = run(rack, trays, sys.argv[4], int(sys.argv[5]))
    sys.stdout.write(text)
    sys.exit(rc)
job = 1000
with open(rack + "/results.jsonl", "a") as out:
    while not os.path.exists(rack + "/stop"):
        job += 1
        for hook in ("prolog", "epilog"):
            before = os.readlink("/opt/imexctl/current")
            for tray, text, rc in run(rack, trays, hook, job):
                after = os.readlink("/opt/imexctl/current")
                rec = {"job": job, "hook": hook, "tray": tray, "rc": rc, "before": before, "after": after}
                out.write(json.dumps(dict(rec, output=text[-800:])) + "\n")
            out.flush()
"""


def _sim_rack(root: Path, trays: int, **extra: dict[str, str]) -> list[str]:
    """Simulated trays in the root, as ``imexctl demo`` makes them, for the installed hooks; their names.

    The node packages leave the simulator out: it is copied from this checkout
    to ``/opt/imexsim`` (it imports nothing of imexctl), with the installed
    package's psutil (the simulator's one dependency), and each tray's config
    names its launchers in ``[commands]``; ``extra`` adds keys.
    """
    sim = root / "opt/imexsim"
    shutil.copytree(REPO / "imexctl/sim", sim / "imexctl/sim", ignore=shutil.ignore_patterns("__pycache__"))
    (psutil,) = root.glob("opt/imexctl/packaged/*/lib/python3.*/site-packages/psutil")
    shutil.copytree(psutil, sim / "psutil", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "imexctl/__init__.py", sim / "imexctl/__init__.py")
    rack = root / RACK.lstrip("/")
    rack.mkdir(parents=True)
    (rack / "faults").write_text("\n")
    (rack / "hooks.py").write_text(HOOKS)
    bins = {}
    for key, name, module in (
        ("nvidia_imex", "nvidia-imex-sim", "imexctl.sim.daemon"),
        ("nvidia_imex_ctl", "nvidia-imex-ctl-sim", "imexctl.sim.ctl"),
    ):
        faults = f"os.environ['IMEX_SIM_FAULTS_FILE'] = '{RACK}/faults'\n" if key == "nvidia_imex" else ""
        path = sim / "bin" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            f"#!/usr/bin/python3\nimport os, sys\n{faults}sys.path.insert(0, '/opt/imexsim')\n"
            f"from {module} import main\nsys.exit(main())\n"
        )
        path.chmod(0o755)
        bins[key] = f"/opt/imexsim/bin/{name}"
    names = [f"tray{i:02d}" for i in range(1, trays + 1)]
    hosts = "".join(f"{RACK_NET}.{10 + i} {n}\n" for i, n in enumerate(names, 1))
    for n in names:
        (rack / n / "proc").mkdir(parents=True)
        (rack / n / "proc/devices").write_text(SIM_PROC_DEVICES)
        (rack / n / "etc/imexctl").mkdir(parents=True)
        (rack / n / "etc/imexctl/hosts").write_text(hosts)
        sections = {
            "paths": {"root": f"{RACK}/{n}"},
            "commands": bins,
            "daemon": {"backend": "exec", "kill_grace_s": "2"},
            "policy": {"fabric": "none", "channels": "job"},
            "resolve": {"method": "hosts_file"},
            "readiness": {"deadline_s": "30"},
        }
        for section, keys in extra.items():
            sections.setdefault(section, {}).update(keys)
        text = "".join(f"[{k}]\n" + "".join(f"{a} = {b}\n" for a, b in v.items()) for k, v in sections.items())
        (rack / f"{n}.conf").write_text(text)
    return names


def _chroot_popen(root: Path, script: str) -> subprocess.Popen[str]:
    """:func:`chroot`, in the background."""
    argv = ["unshare", "--mount", "--fork", "sh", "-c", 'mount -t proc proc "$0/proc" && exec chroot "$0" sh -c "$1"']
    return subprocess.Popen(
        [*argv, str(root), script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=ENV,
    )  # fmt: skip


def _end_processes_in(root: Path) -> None:
    """SIGKILL every process whose root is ``root`` (a test that failed may leave daemons behind)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") == str(root):
                os.kill(int(pid), 9)
        except OSError:
            continue


def _hook(root: Path, trays: list[str], hook: str, job: int) -> subprocess.CompletedProcess[str]:
    return chroot(root, f"exec /usr/bin/python3 {RACK}/hooks.py once {RACK} {','.join(trays)} {hook} {job}", False)


def _active(root: Path) -> str:
    return os.readlink(root / "opt/imexctl/current")


def test_deb_upgrades_and_downgrades_while_hooks_run(deb: Path, deb_next: Path, root: Path) -> None:
    """Two simulated trays run jobs back to back (the installed hooks, the simulator's daemons) while the .deb is
    upgraded to NEXT and downgraded again, 10 times each: no hook fails, hooks ran across the switches, and
    nothing is left behind."""
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_next, root / "tmp/new.deb")
    chroot(root, "dpkg -i /tmp/old.deb")
    made = (root / f"opt/imexctl/versions/{__version__}/BUILD").stat().st_ino
    trays = _sim_rack(root, 2)
    results = root / RACK.lstrip("/") / "results.jsonl"
    loop = _chroot_popen(root, f"exec /usr/bin/python3 {RACK}/hooks.py loop {RACK} {','.join(trays)}")
    switches = []
    try:
        wait_for(lambda: results.exists() and results.read_text().count("\n") >= 4, 60, 0.2, what="the first job")
        for _ in range(10):
            for which, version in (("new", NEXT), ("old", __version__)):
                done = chroot(root, f"DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/{which}.deb", check=False)
                assert done.returncode == 0, done.stdout + done.stderr
                assert _active(root) == f"versions/{version}"
                switches.append(version)
        (root / RACK.lstrip("/") / "stop").touch()
        loop.communicate(timeout=120)
    finally:
        if loop.poll() is None:
            loop.kill()
        _end_processes_in(root)
    assert loop.returncode == 0
    hooks = [json.loads(line) for line in results.read_text().splitlines()]
    failed = [h for h in hooks if h["rc"] != 0]
    assert not failed, json.dumps(failed[:3], indent=1)
    across = [h for h in hooks if h["before"] != h["after"]]
    ran = {v: sum(h["before"] == h["after"] == f"versions/{v}" for h in hooks) for v in (__version__, NEXT)}
    print(f"{len(switches)} switches; {len(hooks)} hooks, none failed; {len(across)} across a switch; by version {ran}")
    assert len(switches) == 20 and len(across) >= 5 and all(ran.values()), (len(across), ran)
    for t in trays:
        assert not list((root / RACK.lstrip("/") / t / "run/imexctl/jobs").iterdir()), f"{t}: a job left behind"
    assert sorted(os.listdir(root / "opt/imexctl/versions")) == sorted([__version__, NEXT])
    assert (root / f"opt/imexctl/versions/{__version__}/BUILD").stat().st_ino == made, "a version is made once"


def test_a_prolog_that_spans_an_upgrade_runs_its_version_wholly(deb: Path, deb_next: Path, root: Path) -> None:
    """A prolog started under the old version waits for the node lock while the .deb is upgraded; it then
    imports the rest of its code (hooks/readiness.py, after its daemon started), the old version's, and
    succeeds. NEXT's readiness beside the old version's modules would fail it (ImportError, exit 70): the
    files under /opt/imexctl replaced one by one did exactly that."""
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_next, root / "tmp/new.deb")
    chroot(root, "dpkg -i /tmp/old.deb")
    trays = _sim_rack(root, 1, daemon={"lock_timeout_s": "120"})
    lock = root / RACK.lstrip("/") / trays[0] / "run/imexctl/lock"
    lock.parent.mkdir(parents=True, mode=0o755)
    held = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    script = f"exec /usr/bin/python3 {RACK}/hooks.py once {RACK} {trays[0]} prolog 7"
    prolog = _chroot_popen(root, script)
    try:
        wait_for(lambda: _opened_by_another(lock), 60, 0.05, what="the prolog to wait for the node lock")
        chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/new.deb")
        assert _active(root) == f"versions/{NEXT}"
        assert prolog.poll() is None, "the prolog still waits"
        fcntl.flock(held, fcntl.LOCK_UN)
        out, _ = prolog.communicate(timeout=120)
    finally:
        os.close(held)
        if prolog.poll() is None:
            prolog.kill()
        _end_processes_in(root)
    assert prolog.returncode == 0, out
    log = (root / RACK.lstrip("/") / trays[0] / "var/log/imexctl.log").read_text().splitlines()
    (done,) = [json.loads(ln) for ln in log if '"prolog.done"' in ln]
    assert done["ok"] is True and done["job_id"] == 7, done
    epilog = _hook(root, trays, "epilog", 7)
    assert epilog.returncode == 0, epilog.stdout
    assert sorted(os.listdir(root / "opt/imexctl/versions")) == sorted([__version__, NEXT]), "the old one stays"


def _opened_by_another(path: Path) -> bool:
    """Whether a process other than this one has ``path`` open."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    return True
            except OSError:
                continue
    return False


def _switch_line(done: subprocess.CompletedProcess[str], version: str = NEXT) -> list[str]:
    """The lines the switch of ``version`` printed."""
    return [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith(f"imexctl {version}:")]


def _other_deb(root: Path) -> str:
    """A package of nothing, with no dependency, in the root's /tmp for apt-get to install; its path there."""
    tree = root / "tmp/other"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: imexctl-test-other\nVersion: 1\nArchitecture: all\nMaintainer: test <test@localhost>\n"
        "Description: another package (tests/test_packaging.py)\n"
    )
    sh(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(root / "tmp/other.deb")])
    return "/tmp/other.deb"


def _apt_installs_another_package(root: Path) -> None:
    """apt-get installs another package and exits 0: dpkg has nothing half-configured."""
    other = _other_deb(root)
    done = chroot(root, f"DEBIAN_FRONTEND=noninteractive apt-get install -y {other}", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert chroot(root, "dpkg --audit").stdout == "", "dpkg has a package to finish"


def _version_check(root: Path) -> dict[str, str]:
    """imexctl doctor's imexctl.version in the root (the version in use runs it)."""
    doctor = chroot(root, "imexctl doctor --json", check=False)
    (check,) = [c for c in json.loads(doctor.stdout)["data"] if c["name"] == "imexctl.version"]
    return dict(check)


def _refused(root: Path) -> dict[str, str]:
    """The switch's record of a refusal, /opt/imexctl/refused, as key -> value."""
    lines = (root / "opt/imexctl/refused").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_deb_refuses_to_switch_to_a_version_that_cannot_read_the_config(deb: Path, deb_next: Path, root: Path) -> None:
    """A config the new version's reader refuses (configparser's 'key: value'): dpkg -i installs NEXT and exits 0
    with the switch's one line; the old version stays in use, apt-get installs another package, doctor, --version
    and the record name NEXT and why; the switch by hand refuses again (exit 1) until the file is fixed, then
    switches."""
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_next, root / "tmp/new.deb")
    chroot(root, "dpkg -i /tmp/old.deb")
    conf = root / "etc/imexctl/imexctl.conf"
    shipped = conf.read_text()
    conf.write_text(shipped + "\n[readiness]\ndeadline_s: 90\n")
    done = chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/new.deb", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = _switch_line(done)
    assert line.startswith(f"imexctl {NEXT}: not switched to; the hooks keep running versions/{__version__} (")
    assert "/etc/imexctl/imexctl.conf: line " in line and "'deadline_s: 90'" in line
    assert line.endswith("); fix it, then run /opt/imexctl/libexec/imexctl-switch"), line
    assert _active(root) == f"versions/{__version__}"
    status = chroot(root, "dpkg-query -W -f '${Status} ${Version}' imexctl").stdout
    assert status == f"install ok installed {NEXT}", "configured: dpkg and apt go on"
    _apt_installs_another_package(root)
    reason = line.split(" (", 1)[1].removesuffix("); fix it, then run /opt/imexctl/libexec/imexctl-switch")
    record = _refused(root)
    assert [record[k] for k in ("version", "active", "why", "reason")] == [NEXT, __version__, "config", reason]
    version = chroot(root, "imexctl --version").stdout.strip()
    assert version == f"imexctl {__version__} (active; {NEXT} installed, refused: {reason})"
    check = _version_check(root)
    assert check["status"] == "FAIL" and check["message"].startswith(f"{NEXT} is installed but not in use: ")
    assert f"the new version cannot read the tray's config ({reason}); the hooks run {__version__}" in check["message"]
    again = chroot(root, "/opt/imexctl/libexec/imexctl-switch", check=False)
    assert again.returncode == 1 and _switch_line(again) == [line], "by hand it still refuses, and says so"
    conf.write_text(shipped + "\n[readiness]\ndeadline_s = 90\n")
    done = chroot(root, "/opt/imexctl/libexec/imexctl-switch")
    assert done.stdout == f"imexctl {NEXT}: in use (the hooks ran versions/{__version__})\n"
    assert _active(root) == f"versions/{NEXT}" and not (root / "opt/imexctl/refused").exists()
    assert chroot(root, "imexctl --version").stdout.strip() == f"imexctl {NEXT}"
    assert _version_check(root)["status"] == "OK"


def test_a_refused_revision_never_touches_the_version_in_use(
    deb: Path, deb_rev: Path, deb_rebuilt: Path, root: Path
) -> None:
    """A new Debian revision of the same upstream version, whose reader refuses the config the version in use reads:
    installed beside it (versions/<revision>), refused, and the version in use is untouched, its files and its
    verdict (preflight 0); another build under the version in use's own name is refused as rebuilt, touching
    nothing either."""
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_rev, root / "tmp/rev.deb")
    shutil.copy(deb_rebuilt, root / "tmp/rebuilt.deb")
    chroot(root, "dpkg -i /tmp/old.deb")
    conf = root / "etc/imexctl/imexctl.conf"
    conf.write_text(conf.read_text() + "\n[readiness]\ndeadline_s = 90\n")
    in_use = root / f"opt/imexctl/versions/{__version__}"
    before = _digests(in_use)
    done = chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/rev.deb", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = _switch_line(done, REVISION)
    assert "not switched to" in line and "deadline_s" in line, line
    assert _active(root) == f"versions/{__version__}" and _digests(in_use) == before
    assert (root / f"opt/imexctl/versions/{REVISION}/BUILD").is_file(), "the revision has a directory of its own"
    assert chroot(root, "/opt/imexctl/bin/imexctl preflight", check=False).returncode == 0, "the code in use runs"
    assert _refused(root)["why"] == "config"
    _apt_installs_another_package(root)
    done = chroot(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/rebuilt.deb", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = _switch_line(done, __version__)
    assert f"versions/{__version__} holds another build of {__version__}, which is in use" in line
    assert _active(root) == f"versions/{__version__}" and _digests(in_use) == before
    assert _refused(root)["why"] == "rebuilt"
    check = _version_check(root)
    assert check["status"] == "FAIL" and check["message"].startswith(f"another build of {__version__} is installed")


def _booted(root: Path, script: str, driver: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """:func:`chroot` as a booted tray: PID 1 runs in the root, the NVIDIA driver ``driver`` is loaded.

    A PID namespace makes the root PID 1's; a tmpfs over ``/proc/driver`` holds
    the driver's ``nvidia/version``; the root has ``/run/systemd/system``.
    """
    (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)
    line = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  (test)"
    inner = (
        'mount -t proc proc "$0/proc" && mount -t tmpfs tmpfs "$0/proc/driver" && mkdir "$0/proc/driver/nvidia" '
        '&& echo "$2" >"$0/proc/driver/nvidia/version" && exec chroot "$0" sh -c "$1"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "sh", "-c", inner, str(root), script, line],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV, check=False,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"in the root: {script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def test_deb_refuses_to_switch_when_nvidia_imex_is_not_the_drivers_version(
    deb: Path, deb_next: Path, root: Path
) -> None:
    """On a booted tray: with nvidia-imex at the loaded driver's version the install switches; after an
    unattended driver update (580.95.05 loaded as 580.105.08) the upgrade is refused in one line naming both
    and dpkg exits 0, the old version stays; with matching versions again, dpkg-reconfigure switches."""
    shutil.copy(deb, root / "tmp/old.deb")
    shutil.copy(deb_next, root / "tmp/new.deb")
    imex = root / "usr/bin/nvidia-imex"
    imex.write_text("#!/bin/sh\necho 'IMEX version is: 580.95.05'\n")
    imex.chmod(0o755)
    _booted(root, "dpkg -i /tmp/old.deb", "580.95.05")
    assert _active(root) == f"versions/{__version__}"
    assert "nvidia-imex 580.95.05 matches the driver" in _booted(root, "imexctl preflight", "580.95.05").stdout
    done = _booted(root, "DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/new.deb", "580.105.08", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = _switch_line(done)
    assert "(nvidia-imex 580.95.05 but the driver is 580.105.08: every job's daemon would refuse to start)" in line
    assert _active(root) == f"versions/{__version__}" and _refused(root)["why"] == "nvidia_imex"
    _booted(root, "DEBIAN_FRONTEND=noninteractive dpkg-reconfigure imexctl", "580.95.05")
    assert _active(root) == f"versions/{NEXT}" and not (root / "opt/imexctl/refused").exists()


# ---------------------------------------------------------------- the .rpm


@pytest.fixture(scope="module")
def rpms(dist: Path) -> dict[str, Path]:
    """The x86_64 and aarch64 (GB200's Grace) RPMs, built by Debian's rpmbuild from the sdist."""
    if os.geteuid() != 0:
        unavailable("the RPM build runs as root here (bash .ci/setup test)")
    _need("rpmbuild", "rpm2cpio", "cpio")
    top = dist / "rpm"
    (top / "SOURCES").mkdir(parents=True)
    shutil.copy(dist / f"imexctl-{__version__}.tar.gz", top / "SOURCES")
    spec = REPO / "pkg/rpm/imexctl.spec"
    out = {}
    for arch in ("x86_64", "aarch64"):
        # --nodeps: Debian's rpm database knows none of the BuildRequires (they are Debian packages here)
        argv = ["rpmbuild", "-bb", "--nodeps", "--target", arch, "--define", f"_topdir {top}", str(spec)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=ENV, check=False)
        if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
            unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        out[arch] = top / "RPMS" / arch / f"imexctl-{__version__}-1.{arch}.rpm"
    return out


def _documented(prefix: str) -> str:
    """The one command line of docs/install.md that starts with ``prefix`` (trailing comment dropped)."""
    page = (REPO / "docs/install.md").read_text()
    found = [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in page.splitlines() if ln.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def test_rpm_builds_by_the_documented_debian_commands(tmp_path: Path) -> None:
    """docs/install.md's RPM-on-Debian lines, run as written in a copy of the checkout, give the RPM."""
    if os.geteuid() != 0:
        unavailable("the RPM build runs as root here (bash .ci/setup test)")
    _need("rpmbuild")
    if subprocess.run([SYS_PYTHON, "-c", "import build"], capture_output=True, check=False).returncode != 0:
        unavailable("needs python3-build (bash .ci/setup test installs it)")
    src = _copy_checkout(tmp_path / "imexctl")
    env = {**ENV, "HOME": str(tmp_path)}  # rpmbuild's default _topdir is ~/rpmbuild
    for line in (_documented("python3 -m build --sdist"), _documented("rpmbuild -bb --nodeps")):
        done = subprocess.run(
            ["sh", "-c", line], cwd=src, capture_output=True, text=True, timeout=900, env=env, check=False
        )
        if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
            unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
        assert done.returncode == 0, (line, (done.stdout + done.stderr)[-3000:])
    arch = os.uname().machine
    assert (tmp_path / f"rpmbuild/RPMS/{arch}/imexctl-{__version__}-1.{arch}.rpm").is_file()


def _python39() -> str | None:
    """A Python 3.9 interpreter (EL9's version) that runs, or None."""
    found = [*sorted(Path("/root/.pyenv/versions").glob("3.9.*/bin/python3.9")), Path("/usr/bin/python3.9")]
    for candidate in found:
        ok = candidate.is_file() and subprocess.run([str(candidate), "-c", "pass"], check=False, timeout=60)
        if ok and ok.returncode == 0:
            return str(candidate)
    return None


def _rpm(rpm: Path, *args: str) -> str:
    return sh(["rpm", "-qp", *args, str(rpm)])


def test_rpm_metadata_files_and_configs(rpms: dict[str, Path]) -> None:
    """The RPM requires EL9's Python 3.9, ships the same layout as the .deb, and marks the configs noreplace."""
    rpm = rpms["x86_64"]
    assert _rpm(rpm, "--qf", "%{NAME} %{VERSION} %{ARCH}") == f"imexctl {__version__} x86_64"
    requires = _rpm(rpm, "-R").splitlines()
    assert "python(abi) = 3.9" in requires and "python3 >= 3.9" in requires
    files = set(_rpm(rpm, "-l").splitlines())
    layout = {p.replace(PACKAGED, RPM_PACKAGED) for p in LAYOUT}
    wanted = {*layout, "/usr/share/man/man8/imexctl.8", "/usr/share/man/man5/imexctl.conf.5"}
    wanted |= {f"{RPM_PACKAGED}/lib/python3.9/site-packages/imexctl/cli/__init__.py"}
    wanted |= {f"/usr/lib/systemd/system/{unit}" for unit in UNITS}
    assert wanted <= files
    assert not [f for f in files if f.startswith(("/usr/lib/.build-id", "/etc/systemd")) or f.endswith(".pyc")]
    assert not [f for f in files if _simulator(f)], "the simulator and the demo stay off the nodes"
    assert "logrotate" not in _rpm(rpm, "--recommends") and "logrotate" in _rpm(rpm, "--suggests")
    assert set(_rpm(rpm, "-c").split()) == {
        "/etc/imexctl/imexctl.conf",
        "/etc/logrotate.d/imexctl",
        "/etc/nhc/scripts/imexctl.nhc",
    }
    assert "/usr/share/licenses/imexctl/LICENSE" in files
    assert _rpm(rpm, "--qf", "%{LICENSE}") == RPM_LICENSE
    # the conffile is pkg/imexctl.conf as it is, the same in every release: no .rpmnew on upgrade
    listed = [line.split() for line in _rpm(rpm, "--qf", "[%{FILENAMES} %{FILEDIGESTS}\n]").splitlines()]
    digests = {fields[0]: fields[1] for fields in listed if len(fields) == 2}
    assert digests["/etc/imexctl/imexctl.conf"] == hashlib.sha256((REPO / "pkg/imexctl.conf").read_bytes()).hexdigest()


def test_rpm_scriptlets_switch_and_enable_nothing(rpms: dict[str, Path]) -> None:
    """%post switches to the new version (a refusal is recorded and exits 0), %preun's erase removes the versions;
    none enables or starts a unit; every scriptlet is valid shell."""
    scripts = _rpm(rpms["x86_64"], "--scripts")
    assert "daemon-reload" in scripts
    assert " enable" not in scripts and " start" not in scripts and "preset" not in scripts
    for tag in ("POSTIN", "PREUN", "POSTUN"):
        body = _rpm(rpms["x86_64"], "--qf", f"%{{{tag}}}")
        sh(["sh", "-n", "-c", body])  # valid shell
    postin = _rpm(rpms["x86_64"], "--qf", "%{POSTIN}")
    assert "/opt/imexctl/libexec/imexctl-switch --package || exit 1\n" in postin, "a refusal is recorded, rpm goes on"
    preun = _rpm(rpms["x86_64"], "--qf", "%{PREUN}")
    erase = preun.split('if [ "$1" -eq 0 ]; then', 1)[1].split("fi", 1)[0]
    assert "systemctl --no-reload disable imexctl-cleanup.service" in erase, "erase removes the enable links"
    assert "systemctl --no-reload disable --now imexctl-metrics.timer" in erase, "and stops the live-gauge timer"
    assert "/opt/imexctl/libexec/imexctl-switch --remove" in erase, "and the versions rpm does not know"
    assert "imexctl-switch" not in preun.replace(erase, ""), "an upgrade leaves the version in use alone"


@pytest.fixture(scope="module")
def rpms_here(dist: Path) -> dict[str, Path]:
    """RPMs for this machine and the clean root's Python (``python_target``), to install, by their whole version:
    __version__-1, NEXT-1, and __version__-2, a new release of the same version with the capped reader."""
    if os.geteuid() != 0:
        unavailable("the RPM build runs as root here (bash .ci/setup test)")
    _need("rpmbuild", "rpm")
    pyver = sh([SYS_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip()
    top = dist / "rpm-here"
    (top / "SOURCES").mkdir(parents=True)
    shutil.copy(dist / f"imexctl-{__version__}.tar.gz", top / "SOURCES")
    nxt = _next_tree(_unpacked_sdist(dist, "rpm-next")).rename(dist / "rpm-next" / f"imexctl-{NEXT}")
    spec = (
        (nxt / "pkg/rpm/imexctl.spec")
        .read_text()
        .replace(f"Version:        {__version__}\n", f"Version:        {NEXT}\n")
    )
    (nxt / "pkg/rpm/imexctl.spec").write_text(spec)
    with tarfile.open(top / "SOURCES" / f"imexctl-{NEXT}.tar.gz", "w:gz") as tar:
        tar.add(nxt, arcname=nxt.name)
    # the release: its own _sourcedir, since its tarball has the same name as __version__'s
    rev = _capped_tree(_unpacked_sdist(dist, "rpm-rev"))
    (rev / "pkg/rpm/imexctl.spec").write_text(
        (rev / "pkg/rpm/imexctl.spec").read_text().replace("Release:        1%{?dist}\n", "Release:        2%{?dist}\n")
    )
    (dist / "rpm-rev-src").mkdir()
    with tarfile.open(dist / "rpm-rev-src" / f"imexctl-{__version__}.tar.gz", "w:gz") as tar:
        tar.add(rev, arcname=rev.name)
    arch = os.uname().machine
    out = {}
    for version, spec_path, sources in (
        (f"{__version__}-1", REPO / "pkg/rpm/imexctl.spec", top / "SOURCES"),
        (f"{NEXT}-1", nxt / "pkg/rpm/imexctl.spec", top / "SOURCES"),
        (f"{__version__}-2", rev / "pkg/rpm/imexctl.spec", dist / "rpm-rev-src"),
    ):
        argv = ["rpmbuild", "-bb", "--nodeps", "--define", f"_topdir {top}", "--define", f"python_target {pyver}"]
        argv += ["--define", f"_sourcedir {sources}"]
        done = subprocess.run(
            [*argv, str(spec_path)], capture_output=True, text=True, timeout=900, env=ENV, check=False
        )
        if done.returncode != 0 and _pip_problem(done.stdout + done.stderr):
            unavailable(f"pip cannot reach the package index: {_pip_problem(done.stdout + done.stderr)}")
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        out[version] = top / "RPMS" / arch / f"imexctl-{version}.{arch}.rpm"
    return out


def test_rpm_scriptlets_run_under_rpm(rpms_here: dict[str, Path], root: Path) -> None:
    """Debian's rpm installs the RPMs into the clean root and runs their scriptlets there: %post switches to
    the new version (rpm removes the old package's files only after it, never the version in use); a %post
    whose version cannot read the config switches nothing, records it and exits 0 (rpm says nothing of a
    scriptlet), while the hooks keep their version; the switch run by hand once fixed; a new release of the same
    version refused beside the version in use, which it never touches; erase leaves nothing under /opt/imexctl."""
    old, nxt, rev = f"{__version__}-1", f"{NEXT}-1", f"{__version__}-2"
    db = ["rpm", f"--root={root}", "--dbpath=/var/lib/rpm"]
    rpm = [*db, "--nodeps"]  # the root's packages are dpkg's: rpm's database knows none of them
    for version, path in rpms_here.items():
        shutil.copy(path, root / f"tmp/{version}.rpm")
    sh([*db, "--initdb"])
    sh([*rpm, "-i", f"{root}/tmp/{old}.rpm"])
    assert _active(root) == f"versions/{old}"
    assert chroot(root, "/opt/imexctl/bin/imexctl --version").stdout.strip() == f"imexctl {old}"
    sh([*rpm, "-U", f"{root}/tmp/{nxt}.rpm"])
    assert _active(root) == f"versions/{nxt}"
    assert sorted(os.listdir(root / "opt/imexctl/packaged")) == [nxt], "rpm removed the old package's files"
    assert sorted(os.listdir(root / "opt/imexctl/versions")) == sorted([old, nxt])
    conf = root / "etc/imexctl/imexctl.conf"
    shipped = conf.read_text()
    conf.write_text(shipped + "\n[readiness]\ndeadline_s: 90\n")
    done = subprocess.run(
        [*rpm, "-U", "--oldpackage", f"{root}/tmp/{old}.rpm"], capture_output=True, text=True, timeout=300,
        env=ENV, check=False,
    )  # fmt: skip
    (line,) = _switch_line(done, old)
    assert f"the hooks keep running versions/{nxt} (" in line, done.stdout + done.stderr
    assert done.returncode == 0 and "scriptlet failed" not in done.stderr, done.stderr
    assert _active(root) == f"versions/{nxt}", "the hooks keep the version they ran"
    assert sh([*db, "-q", "imexctl"]).strip() == f"imexctl-{old}.{os.uname().machine}", "rpm recorded it"
    assert _refused(root)["version"] == old and _refused(root)["why"] == "config"
    said = chroot(root, "/opt/imexctl/bin/imexctl --version").stdout.strip()
    assert said.startswith(f"imexctl {nxt} (active; {old} installed, refused: "), said
    conf.write_text(shipped)
    chroot(root, "/opt/imexctl/libexec/imexctl-switch")
    assert _active(root) == f"versions/{old}" and not (root / "opt/imexctl/refused").exists()
    conf.write_text(shipped + "\n[readiness]\ndeadline_s = 90\n")  # read by old, refused by the new release
    in_use = root / f"opt/imexctl/versions/{old}"
    before = _digests(in_use)
    done = subprocess.run(
        [*rpm, "-U", f"{root}/tmp/{rev}.rpm"], capture_output=True, text=True, timeout=300, env=ENV, check=False
    )
    (line,) = _switch_line(done, rev)
    assert done.returncode == 0 and "deadline_s" in line, done.stdout + done.stderr
    assert _active(root) == f"versions/{old}" and _digests(in_use) == before
    assert chroot(root, "/opt/imexctl/bin/imexctl preflight", check=False).returncode == 0, "the code in use runs"
    sh([*rpm, "-e", "imexctl"])
    assert not (root / "opt/imexctl").exists()


def test_rpm_payload_matches_its_architecture(rpms: dict[str, Path], tmp_path: Path) -> None:
    """Each RPM carries psutil's shared object for its own machine (ELF e_machine), built for CPython 3.9."""
    for arch, machine in (("x86_64", 62), ("aarch64", 183)):
        dest = tmp_path / arch
        dest.mkdir()
        cpio = subprocess.run(["rpm2cpio", str(rpms[arch])], capture_output=True, check=True, timeout=120)
        subprocess.run(["cpio", "-idm", "--quiet"], input=cpio.stdout, cwd=dest, check=True, timeout=120)
        (so,) = (dest / f"{RPM_PACKAGED.lstrip('/')}/lib/python3.9/site-packages/psutil").glob("*.so")
        assert int.from_bytes(so.read_bytes()[18:20], "little") == machine
    site = tmp_path / f"x86_64{RPM_PACKAGED}/lib/python3.9/site-packages"
    python39 = _python39()
    if python39 is None:
        pytest.skip("no working Python 3.9 on this machine to run the RPM's payload with")
    # -S: only the payload, not what this interpreter's own site-packages may hold (EL9's python3 has none of it)
    code = f"import sys; sys.path.insert(0, {str(site)!r}); from imexctl.cli import main; sys.exit(main(['--version']))"
    out = subprocess.run(
        [str(python39), "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == f"imexctl {__version__}", out.stderr
    # --version takes the fast path: import what the hooks and doctor use, every bundled dependency among it
    code = f"import sys; sys.path.insert(0, {str(site)!r}); import structlog, tenacity, psutil, pynvml, imexctl.hooks.prolog, imexctl.hooks.teardown, imexctl.doctor.checks"
    out = subprocess.run(
        [str(python39), "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
