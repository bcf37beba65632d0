"""A Debian 13 (trixie) root with Slurm 24.11 and imexctl, built once per machine and cached on disk.

``ensure_root()`` returns the cached root, or builds it under a lock (concurrent test processes and the
background build started by ``.ci/setup test`` share one build):

1. ``debootstrap --variant=minbase`` of :func:`packages` from :data:`MIRROR` (Slurm, munge, Python, and
   systemd + dbus so that the same root can be booted with ``systemd-nspawn``; sid adds Apptainer);
2. the lab's job user (:data:`TEST_USER`, uid :data:`TEST_UID`) and its own primary group
   (:data:`TEST_GROUP`, gid :data:`TEST_GID`, a number other than the uid), as on the host;
3. a venv at ``/opt/imexctl`` made with the root's own ``python3``, imexctl's dependencies from PyPI
   (wheels fetched by the host's pip for the root's Python), and imexctl installed *editable* from
   ``/opt/imexctl-src``. That directory is left empty: a lab bind-mounts the checkout there, so the
   root always runs the checkout's code and the repository's hooks run unchanged inside it.

The cache key hashes everything above (suite, mirror, packages, imexctl's ``install_requires`` and
console scripts, the user, :data:`BUILD_STEPS`), so a change to any of them builds a new root beside the
old one. ``python -m tests.lab
root --prune`` removes the roots of other keys (about 300 MB each).

A *flavour* of the default suite's root (:data:`FLAVOURS`, ``ensure_root(flavour=...)``) is a root of its own
key beside it with more packages, whose units named there are left disabled: ``firewalld`` boots nodes that a
test gives firewalld (tests/ansible/test_role.py). Without a flavour every key is what it was.

``plain_root()`` is the same cache for a bare ``debootstrap --variant=minbase`` root and nothing else (the
clean Debian 12 of the packaging tests and of the fresh-machine test, tests/test_freshroot.py).
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tests.lab.procs import SYS_PATH, LabError, sh

__all__ = [
    "CACHE",
    "FLAVOURS",
    "PACKAGES",
    "SRC",
    "SUITE_PACKAGES",
    "TEST_GID",
    "TEST_GROUP",
    "TEST_UID",
    "TEST_USER",
    "VENV",
    "DebRoot",
    "build_problems",
    "cached_root",
    "copy_source",
    "download_wheels",
    "ensure_root",
    "ensure_wheelhouse",
    "packages",
    "plain_root",
    "prune",
    "root_key",
]

#: the Debian suite of each Slurm series the lab runs from a root (Debian 12's 22.05 runs from the host)
SUITES = {"24.11": "trixie", "26.05": "sid"}
#: the suite of the default root: the Slurm 24.11 lab and the booted nodes of the systemd lab
SUITE = SUITES["24.11"]
MIRROR = "http://deb.debian.org/debian"
#: the packages of every root
PACKAGES = (
    "slurmd",
    "slurmctld",
    "slurm-client",
    "munge",
    "python3",
    "python3-venv",
    "iproute2",
    "systemd",
    "systemd-sysv",
    "dbus",
)
#: more packages per suite, each changing only its own suite's key: sid ships apptainer 1.4.5, which the
#: container lab runs under Slurm 26.05 (tests/lab/test_containers_lab.py; trixie has no apptainer); the
#: booted nodes of the systemd lab (trixie) are reached by Ansible over ssh as a site's are (sshd, and
#: python3-apt for its apt module) and get the role's nftables rule (tests/ansible/test_role.py)
SUITE_PACKAGES = {"sid": ("apptainer",), "trixie": ("openssh-server", "python3-apt", "nftables")}


#: flavour -> (more packages, their units left disabled): every machine of a lab boots the same root, so a
#: unit such as firewalld starts only where a test starts it (the role's test: one node's firewall).
#: firewalld needs polkitd, which needs "default-logind | logind": debootstrap takes no alternative by itself
FLAVOURS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "firewalld": (("firewalld", "libpam-systemd"), ("firewalld.service",)),
}


def packages(suite: str, flavour: str = "") -> tuple[str, ...]:
    """The packages debootstrap installs into the root of ``suite`` (and of its ``flavour``, FLAVOURS)."""
    return PACKAGES + SUITE_PACKAGES.get(suite, ()) + (FLAVOURS[flavour][0] if flavour else ())


CACHE = Path("/var/cache/imexctl-lab")
VENV = "/opt/imexctl"
SRC = "/opt/imexctl-src"
TEST_USER = "imexlab"
TEST_UID = 1501
#: the job user's primary group: its gid differs from the uid, so a channel given to the two the wrong way
#: round shows in the lab (``.ci/setup`` makes the same group on the host)
TEST_GROUP = "imexlabgrp"
TEST_GID = 1502
# bump when the build steps change in a way the key does not see
BUILD_STEPS = 1
REPO = Path(__file__).resolve().parents[2]
DEBOOTSTRAP_TIMEOUT = 1200
INFO = "info.json"


@dataclass(frozen=True)
class DebRoot:
    """A built root: its file system and what was recorded when it was built."""

    path: Path
    info: dict[str, Any]

    @property
    def slurm_version(self) -> str:
        """Slurm's version in the root, e.g. ``24.11.5``."""
        return str(self.info["slurm_version"])


def _setup_cfg(repo: Path, section: str, key: str) -> list[str]:
    """Return the lines of a multi-line setup.cfg value, comments left out."""
    cfg = configparser.ConfigParser()
    cfg.read(repo / "setup.cfg", encoding="utf-8")
    lines = cfg.get(section, key, fallback="").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _install_requires(repo: Path) -> list[str]:
    return _setup_cfg(repo, "options", "install_requires")


def root_key(repo: Path = REPO, suite: str = SUITE, flavour: str = "") -> str:
    """Return the cache key of the root of ``suite`` this checkout needs (e.g. ``trixie-<12 hex digits>``).

    A flavour's key names it (``trixie-firewalld-<12 hex digits>``); without one the key is what it always was.
    """
    spec: dict[str, Any] = {
        "suite": suite,
        "mirror": MIRROR,
        "variant": "minbase",
        "packages": sorted(packages(suite, flavour)),
        "requires": _install_requires(repo),
        "user": [TEST_USER, TEST_UID, TEST_GROUP, TEST_GID],
        "steps": BUILD_STEPS,
        # the editable install fixes the console scripts; the code itself comes from the checkout
        "scripts": _setup_cfg(repo, "options.entry_points", "console_scripts"),
    }
    if flavour:
        spec["disabled"] = list(FLAVOURS[flavour][1])
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{suite}-{flavour}-{digest}" if flavour else f"{suite}-{digest}"


def build_problems() -> list[str]:
    """Return why this machine cannot build or use a root (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (debootstrap and chroot need root)")
    missing = [b for b in ("debootstrap", "chroot") if shutil.which(b, path=SYS_PATH) is None]
    if missing:
        problems.append(f"missing {', '.join(missing)} (apt-get install debootstrap)")
    return problems


def cached_root(repo: Path = REPO, suite: str = SUITE, flavour: str = "") -> DebRoot | None:
    """Return the root of ``suite`` (and ``flavour``) this checkout needs if it is already built, else None."""
    final = CACHE / root_key(repo, suite, flavour)
    try:
        info = json.loads((final / INFO).read_text())
    except (OSError, ValueError):
        return None
    return DebRoot(final / "root", info)


@contextlib.contextmanager
def _locked(path: Path, timeout: float, log: Callable[[str], None]) -> Iterator[None]:
    """Hold an exclusive flock on ``path``, waiting at most ``timeout`` s for another builder."""
    with open(path, "a") as fh:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"{path} still locked after {timeout:.0f}s (another build hangs?)") from None
                if not told:
                    log(f"waiting for another process building the root ({path})")
                    told = True
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_root(
    repo: Path = REPO,
    log: Callable[[str], None] = print,
    lock_timeout: float = 1800,
    suite: str = SUITE,
    flavour: str = "",
) -> DebRoot:
    """Return the root of ``suite`` (and ``flavour``) this checkout needs, building it first if no process has yet."""
    found = cached_root(repo, suite, flavour)
    if found:
        return found
    problems = build_problems()
    if problems:
        raise LabError("cannot build the Debian root: " + "; ".join(problems))
    CACHE.mkdir(mode=0o755, parents=True, exist_ok=True)
    key = root_key(repo, suite, flavour)
    with _locked(CACHE / f"{key}.lock", lock_timeout, log):
        found = cached_root(repo, suite, flavour)
        if found:
            return found
        partial = CACHE / f"{key}.partial"
        if partial.exists():
            shutil.rmtree(partial)  # a build that died; we hold the lock, so nobody else uses it
        partial.mkdir(mode=0o755)
        t0 = time.monotonic()
        info = _build(partial, repo, suite, log, flavour)
        info["build_s"] = round(time.monotonic() - t0, 1)
        (partial / INFO).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        os.rename(partial, CACHE / key)
        log(f"built {CACHE / key} in {info['build_s']:.0f}s (Slurm {info['slurm_version']})")
    found = cached_root(repo, suite, flavour)
    if found is None:
        raise LabError(f"{CACHE / key} has no {INFO} right after its build")
    return found


def plain_root(
    prefix: str, suite: str, include: Sequence[str] = (), log: Callable[[str], None] = print, lock_timeout: float = 1800
) -> Path:
    """Return a bare ``debootstrap --variant=minbase`` root of ``suite`` (and the packages ``include``).

    Built once per machine under the lock of its key and cached as ``CACHE/<prefix>-<suite>-<hash>/root``
    (the hash covers the suite, the mirror, the packages and the variant); callers copy or overlay it and
    never change it. Raises LabError with debootstrap's last lines when the build fails.
    """
    spec = json.dumps({"suite": suite, "mirror": MIRROR, "packages": list(include), "variant": "minbase"})
    key = f"{prefix}-{suite}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    final = CACHE / key
    if (final / "root/usr/bin/apt-get").exists():
        return final / "root"
    problems = build_problems()
    if problems:
        raise LabError("cannot build the Debian root: " + "; ".join(problems))
    CACHE.mkdir(mode=0o755, parents=True, exist_ok=True)
    with _locked(CACHE / f"{key}.lock", lock_timeout, log):
        if not (final / "root/usr/bin/apt-get").exists():
            partial = CACHE / f"{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)  # a build that died; we hold the lock
            debs = CACHE / "debs" / suite
            debs.mkdir(mode=0o755, parents=True, exist_ok=True)
            log(f"debootstrap {suite} into {final} (about a minute)")
            argv = ["debootstrap", "--variant=minbase", f"--cache-dir={debs}"]
            if include:
                argv.append(f"--include={','.join(include)}")
            res = sh([*argv, suite, str(partial / "root"), MIRROR], check=False, timeout=DEBOOTSTRAP_TIMEOUT)
            if res.returncode != 0:
                tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
                raise LabError(f"debootstrap {suite} failed ({res.returncode}):\n{tail}")
            shutil.rmtree(partial / "root/var/cache/apt/archives", ignore_errors=True)
            (partial / "root/var/cache/apt/archives/partial").mkdir(parents=True)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(partial, final)
    return final / "root"


def ensure_wheelhouse(
    root: DebRoot, repo: Path = REPO, log: Callable[[str], None] = print, lock_timeout: float = 600
) -> Path:
    """Return a directory of wheels that installs imexctl offline with the root's Python.

    It holds imexctl's dependencies and setuptools (which building imexctl from a checkout needs), fetched
    once by the host's pip and cached beside the root (``<key>.wheels``; ``prune`` drops other keys' ones).
    """
    key = root.path.parent.name
    final = CACHE / f"{key}.wheels"
    if final.is_dir():
        return final
    with _locked(CACHE / f"{key}.wheels.lock", lock_timeout, log):
        if final.is_dir():
            return final
        partial = CACHE / f"{key}.wheels.partial"
        if partial.exists():
            shutil.rmtree(partial)  # a download that died; we hold the lock
        partial.mkdir(mode=0o755)
        pyver = "".join(str(root.info["python"]).split(".")[:2])
        log(f"fetching wheels for Python {pyver} into {final}")
        download_wheels(partial, pyver, _install_requires(repo))
        os.rename(partial, final)
    return final


def prune(repo: Path = REPO, log: Callable[[str], None] = print) -> list[Path]:
    """Remove the cached roots of other keys (older checkouts), except any a lab in sight still mounts."""
    keep = {root_key(repo, suite) for suite in SUITES.values()} | {root_key(repo, SUITE, f) for f in FLAVOURS}
    mounted = Path("/proc/self/mountinfo").read_text()
    removed = []
    for path in sorted(p for suite in sorted(set(SUITES.values())) for p in CACHE.glob(f"{suite}-*")):
        if path.name.split(".")[0] in keep or not path.is_dir():
            continue
        if f"lowerdir={path}/" in mounted:
            log(f"keeping {path}: a lab still runs from it")
            continue
        with open(CACHE / f"{path.name.split('.')[0]}.lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"keeping {path}: a build holds its lock")
                continue
            shutil.rmtree(path)
        removed.append(path)
        log(f"removed {path}")
    return removed


def _chroot(root: Path, *argv: str, timeout: float = 300) -> str:
    """Run a command inside the root with a clean environment and return its stdout."""
    env = {"PATH": SYS_PATH, "LANG": "C", "HOME": "/root"}
    return sh(["chroot", str(root), *argv], env=env, timeout=timeout).stdout


def _build(partial: Path, repo: Path, suite: str, log: Callable[[str], None], flavour: str = "") -> dict[str, Any]:
    """Run the build steps into ``partial/root`` and return what to record."""
    root = partial / "root"
    # one package cache per suite: sid and trixie share package names and versions that differ
    debs = CACHE / "debs" / suite
    debs.mkdir(mode=0o755, parents=True, exist_ok=True)
    log(f"debootstrap {suite} into {root} (about a minute)")
    res = sh(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages(suite, flavour))}",
            f"--cache-dir={debs}",
            suite,
            str(root),
            MIRROR,
        ],
        check=False,
        timeout=DEBOOTSTRAP_TIMEOUT,
    )
    (partial / "debootstrap.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
        raise LabError(f"debootstrap failed ({res.returncode}); see {partial}/debootstrap.log:\n{tail}")
    _chroot(root, "groupadd", "--gid", str(TEST_GID), TEST_GROUP)
    _chroot(
        root, "useradd", "--uid", str(TEST_UID), "--gid", str(TEST_GID), "--no-create-home",
        "--shell", "/usr/sbin/nologin", TEST_USER,
    )  # fmt: skip
    if not (root / "etc/munge/munge.key").exists():
        _chroot(root, "mungekey", "--create")
        _chroot(root, "chown", "munge:munge", "/etc/munge/munge.key")
    for unit in FLAVOURS[flavour][1] if flavour else ():
        _chroot(root, "systemctl", "disable", unit)  # offline in a chroot: only the unit's links go
    _install_imexctl(root, repo, log)
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True)
    return {
        "key": root_key(repo, suite, flavour),
        "suite": suite,
        "mirror": MIRROR,
        "packages": sorted(packages(suite, flavour)),
        "slurm_version": _chroot(root, "slurmd", "-V").split()[-1],
        "python": _chroot(root, "/usr/bin/python3", "-c", "import sys; print(sys.version.split()[0])").strip(),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def download_wheels(dest: Path, pyver: str, requires: list[str], timeout: float = 600) -> None:
    """Fetch wheels of ``requires`` (and setuptools, to build imexctl) for CPython ``pyver`` (e.g. ``313``).

    The host's pip and its configuration do the download, so a root or container installs offline.
    """
    sh(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "-d",
            str(dest),
            "--only-binary=:all:",
            "--python-version",
            pyver,
            "--implementation",
            "cp",
            "--abi",
            f"cp{pyver}",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "linux_x86_64",
            *requires,
            "setuptools>=64",
        ],
        env=os.environ,
        timeout=timeout,
    )


def copy_source(repo: Path, dest: Path) -> None:
    """Copy what building and installing imexctl needs from a checkout (no caches) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(repo / "imexctl", dest / "imexctl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(repo / name, dest / name)


def _install_imexctl(root: Path, repo: Path, log: Callable[[str], None]) -> None:
    """Make the venv, install the dependencies from downloaded wheels and imexctl editable from SRC."""
    pyver = _chroot(root, "/usr/bin/python3", "-c", "import sys; print('%d%d' % sys.version_info[:2])").strip()
    wheels = root / "tmp" / "imexctl-wheels"
    wheels.mkdir(parents=True)
    requires = _install_requires(repo)
    log(f"fetching wheels for Python {pyver}: {', '.join(requires)}")
    download_wheels(wheels, pyver, requires)
    src = root / SRC.lstrip("/")
    copy_source(repo, src)
    _chroot(root, "/usr/bin/python3", "-m", "venv", VENV)
    _chroot(
        root,
        f"{VENV}/bin/pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--no-index",
        "--find-links",
        "/tmp/imexctl-wheels",
        "-e",
        SRC,
        timeout=600,
    )
    _chroot(root, f"{VENV}/bin/imexctl", "--version")
    # from now on the code comes from the checkout a lab bind-mounts here, never from a stale copy
    for child in src.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    shutil.rmtree(wheels)
