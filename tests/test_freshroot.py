"""The README's two commands on a fresh Debian 12 machine, from nothing, on every CI run (marker ``freshroot``).

CI's machine has run ``.ci/setup test`` before the suite starts, so everything under ``/opt/imexctl*`` is there
when the tests run, and a setup that only works on a machine where it already ran stays green (issue 31: a
requirement split into shell words broke every new machine while CI passed). These tests start each time from

- a clean Debian 12: ``debootstrap --variant=minbase bookworm``, built once per machine and cached like the labs'
  roots (tests/lab/debroot.py, ``plain_root``), used through an overlay of its own per test, so the cache never
  changes;
- what a fresh machine gets from its site, and only that (:func:`site`): the CA certificates, the DNS resolver,
  apt's sources and its ``Acquire`` settings (proxies, validity), pip's configuration files, the local files and
  directories they name (wheels, indexes, constraints; directories bound read-only), and the ``PIP_*`` and proxy
  variables of this process's environment;
- a clone of this checkout's HEAD in ``/root/imexctl`` (committed code: what CI clones);

and run the README's command in a chroot, as root with no stdin, in mount and PID namespaces of its own.
What the chroot adds, because it is not a booted machine (none of it is something ``.ci/setup`` installs):

- ``/usr/sbin/policy-rc.d`` refuses every service start, and ``/run`` is an empty tmpfs (no
  ``/run/systemd/system``: systemctl acts offline): apt starts no munge, slurmd or Prometheus here;
- dpkg unpacks without an fsync per file (``--force-unsafe-io``): the root is thrown away after the test;
- ``/proc`` of the PID namespace, ``/dev`` bound from the host; ``imexctl demo`` runs in a network namespace with
  only ``lo``, so its simulated trays meet nothing on the host's 127.0.0.x;
- apt's archive cache is an overlay over the host's ``/var/cache/apt/archives`` (read-only below, this test's
  downloads above): warm on a machine that has run ``.ci/setup test``, never written by the root;
- when the command ends, the PID namespace ends with it: the kernel kills whatever was left in it (``.ci/setup
  test``'s background build of the labs' Debian roots, which writes the root's own ``/var/cache/imexctl-lab``,
  never the host's), and the test checks that nothing is left running in the root.

They need root, debootstrap, chroot, unshare, overlayfs, git, the Debian mirror and pip's index; without them they
skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.__main__ import PARTS
from tests.lab import debroot
from tests.lab.procs import SYS_PATH, LabError, processes_rooted_at
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

pytestmark = pytest.mark.freshroot

REPO = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
#: where the clone lies in the root, and the environment a root login there has
CLONE = "/root/imexctl"
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
#: the site's environment a fresh machine gets too: pip's variables and the proxies
SITE_ENV_PREFIXES = ("PIP_",)
SITE_ENV_NAMES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
APT_ARCHIVES = Path("/var/cache/apt/archives")
#: a hang guard, not a speed target: .ci/setup test takes a few minutes with a warm apt cache (the module's doc)
SETUP_TIMEOUT = 2400
DEMO_TIMEOUT = 900

# Run as PID 1 of new mount and PID namespaces (unshare --kill-child: a killed test kills it too):
#   $1 the cached root (overlay's lower), $2 this test's directory (upper, work, merged, site/, binds, env),
#   $3 the lower of apt's archive cache, $4 "netns" to run the command in a new network namespace with only lo,
#   $5 the command, run in the chroot as a root login with no stdin.
# Then prints the processes left in the namespace; the kernel kills them as this script, its PID 1, exits.
NAMESPACE_SCRIPT = r"""
set -eu
lower=$1 top=$2 apt=$3 net=$4 cmd=$5
m=$top/merged
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$top/upper,workdir=$top/work" "$m"
rm -f "$m/etc/apt/sources.list"
cp -a "$top/site/." "$m/"
mount -t overlay overlay -o "lowerdir=$apt,upperdir=$top/apt-upper,workdir=$top/apt-work" "$m/var/cache/apt/archives"
mount -t proc proc "$m/proc"
mount --rbind /dev "$m/dev"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$m/run"
while IFS= read -r dir; do
    mkdir -p "$m$dir"
    mount --bind "$dir" "$m$dir"
    mount -o remount,bind,ro "$m$dir"
done <"$top/binds"
mapfile -d '' env <"$top/env"
set -- chroot "$m" /usr/bin/env -i "${env[@]}" /bin/bash -c "$cmd"
[ "$net" = netns ] && set -- unshare --net sh -c 'ip link set lo up && exec "$@"' sh "$@"
echo "freshroot: $(date +%T) running: $cmd"
rc=0
"$@" </dev/null || rc=$?
echo "freshroot: $(date +%T) exit $rc"
for p in "$m"/proc/[0-9]*; do
    [ "${p##*/}" = 1 ] && continue
    cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-200) || continue
    [ -n "$cmdline" ] && echo "freshroot: left running, killed: ${p##*/} $cmdline"
done
exit "$rc"
"""


def _problems() -> list[str]:
    """Why this machine cannot run a fresh root (empty when it can)."""
    problems = list(debroot.build_problems())
    missing = [b for b in ("unshare", "mount", "git", "ip") if shutil.which(b, path=SYS_PATH) is None]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("the kernel has no overlay file system")
    return problems


def _local_paths(value: str) -> list[Path]:
    """The local files and directories a pip setting names (paths and file:// URLs; http(s) ones are not local)."""
    found = []
    for token in value.split():
        path = urllib.parse.unquote(urllib.parse.urlparse(token).path) if token.startswith("file:") else token
        if path.startswith("/") and os.path.exists(path):
            found.append(Path(path))
    return found


def _pip_config_files() -> dict[str, Path]:
    """pip's configuration files on this machine (pip's documented places on Linux), by their path in the root.

    Global ones under each XDG_CONFIG_DIRS entry and /etc/pip.conf, the user's (~/.pip, ~/.config/pip; root's
    home in the root is /root), and PIP_CONFIG_FILE's.
    """
    home = Path.home()
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    files: dict[str, Path] = {}
    for base in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"):
        files[f"{base}/pip/pip.conf"] = Path(base) / "pip/pip.conf"
    files["/etc/pip.conf"] = Path("/etc/pip.conf")
    files["/root/.pip/pip.conf"] = home / ".pip/pip.conf"
    files["/root/.config/pip/pip.conf"] = xdg_home / "pip/pip.conf"
    if os.environ.get("PIP_CONFIG_FILE"):
        files[os.environ["PIP_CONFIG_FILE"]] = Path(os.environ["PIP_CONFIG_FILE"])
    return {dest: src for dest, src in files.items() if src.is_file()}


def _unowned(paths: list[Path]) -> list[Path]:
    """The paths that no installed Debian package owns (``dpkg-query -S``)."""
    if not paths:
        return []
    done = subprocess.run(
        ["dpkg-query", "-S", *map(str, paths)], capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": SYS_PATH, "LANG": "C"},
    )  # fmt: skip
    owned = {line.rpartition(": ")[2] for line in done.stdout.splitlines()}
    return [p for p in paths if str(p) not in owned]


def site() -> tuple[dict[str, Path], list[Path], dict[str, str]]:
    """What a fresh machine gets from this site: files to copy into the root (path in the root -> file here),
    directories to bind read-only at the same path, and environment variables."""
    files: dict[str, Path] = {}
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/resolv.conf"):
        if Path(path).is_file():
            files[path] = Path(path)
    for path in sorted(Path("/usr/local/share/ca-certificates").rglob("*.crt")):
        files[str(path)] = path
    # apt's: every file under /etc/apt that no Debian package installed (sources, keys, proxies and other
    # settings: the site's and the image's own); auth.conf.d's credentials stay out of the root
    found = [p for p in sorted(Path("/etc/apt").rglob("*")) if p.is_file() and "auth.conf.d" not in p.parts]
    for path in _unowned(found):
        files[str(path)] = path
    env = {k: v for k, v in os.environ.items() if k.startswith(SITE_ENV_PREFIXES) or k in SITE_ENV_NAMES}
    # pip's files, and what their settings and the PIP_* variables name: files copied, directories bound
    values = [v for k, v in env.items() if k.startswith("PIP_")]
    for dest, src in _pip_config_files().items():
        files[dest] = src
        cfg = configparser.RawConfigParser()
        cfg.read(src, encoding="utf-8")
        values += [v for section in cfg.sections() for _, v in cfg.items(section)]
    binds: list[Path] = []
    for value in values:
        for path in _local_paths(value):
            if path.is_dir():
                # a PEP 503 index's pages may link to files beside it (/opt/pypi/simple -> ../../files/...)
                binds.append(path.parent if path.name == "simple" else path)
            else:
                files[str(path)] = path
    return files, sorted(set(binds)), env


class FreshRoot:
    """One throw-away fresh machine: an overlay of the cached clean root, the site's files, a clone of HEAD."""

    def __init__(self, base: Path, top: Path) -> None:
        self.base = base
        self.top = top
        self.merged = top / "merged"
        self.upper = top / "upper"
        for name in ("upper", "work", "merged", "apt-upper", "apt-work", "site"):
            (top / name).mkdir(mode=0o755)
        files, binds, env = site()
        for dest, src in files.items():
            target = top / "site" / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        # chroot only (the module's doc): apt starts no service in the root
        policy = top / "site/usr/sbin/policy-rc.d"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text("#!/bin/sh\n# freshroot: a chroot, not a booted machine: no service starts here\nexit 101\n")
        policy.chmod(0o755)
        # chroot only: a throw-away root needs no fsync after each of the packages' files (tens of thousands:
        # ansible's collections alone); the same packages, scripts and setup, minutes less
        unsafe = top / "site/etc/apt/apt.conf.d/99freshroot-unsafe-io"
        unsafe.parent.mkdir(parents=True, exist_ok=True)
        unsafe.write_text('// freshroot: a throw-away root\nDPkg::Options { "--force-unsafe-io"; };\n')
        (top / "binds").write_text("".join(f"{b}\n" for b in binds))
        (top / "env").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in {**ROOT_ENV, **env}.items()))
        self.site_files = sorted(files)
        self.binds = binds
        self.seconds: dict[str, float] = {}
        # a clone of HEAD, as CI clones it, where the root's /root is (upper: the cache stays as it is)
        clone = top / "site" / CLONE.lstrip("/")
        clone.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(clone.parent, 0o700)
        subprocess.run(
            ["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)],
            check=True, capture_output=True, timeout=300, env={"PATH": SYS_PATH, "HOME": str(top)},
        )  # fmt: skip
        self.head = _git(clone, "rev-parse", "HEAD")

    def run(self, command: str, timeout: float, netns: bool = False) -> str:
        """Run a shell command in the root (in a network namespace of its own with ``netns``); fail the test
        with the end of its output unless it exits 0 within ``timeout`` seconds. Returns its output."""
        apt_lower = APT_ARCHIVES if APT_ARCHIVES.is_dir() else self.top / "apt-empty"
        apt_lower.mkdir(exist_ok=True)
        argv = ["unshare", "--mount", "--pid", "--kill-child", "--propagation", "private", "bash", "-c"]
        argv += [NAMESPACE_SCRIPT, "freshroot", str(self.base), str(self.top), str(apt_lower)]
        argv += ["netns" if netns else "-", command]
        log = self.top / "run.log"
        t0 = time.monotonic()
        with log.open("w") as out:
            try:
                rc = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                    env={"PATH": SYS_PATH, "LANG": "C"}, check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = None
        self.seconds[command] = round(time.monotonic() - t0, 1)
        # the namespace's end killed what was left in it: nothing may still run in the root
        wait_for(lambda: not processes_rooted_at(self.merged), 30, 0.2, what=f"processes in {self.merged} to end")
        text = log.read_text(errors="replace")
        print(text)
        # the end of the output, without pip's notes on the site's indexes (one per package they lack)
        lines = [ln for ln in text.splitlines() if not (ln.startswith("WARNING: Location") and "is ignored" in ln)]
        tail = "\n".join(lines[-60:])
        assert rc is not None, f"{command}: still running after {timeout:.0f} s (killed):\n{tail}"
        assert rc == 0, f"{command}: exit {rc}:\n{tail}"
        return text

    def file(self, path: str) -> Path:
        """A file the commands made in the root (the overlay's upper layer)."""
        return self.upper / path.lstrip("/")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=60,
        env={"PATH": SYS_PATH, "HOME": str(repo)},
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def fresh() -> Iterator[FreshRoot]:
    """A fresh machine: the cached clean Debian 12 root under an overlay, the site's files, a clone of HEAD."""
    problems = _problems()
    if problems:
        unavailable("a fresh root needs " + "; ".join(problems))
    try:
        base = debroot.plain_root("freshroot", SUITE, log=lambda msg: print(f"[freshroot] {msg}", flush=True))
    except LabError as exc:
        unavailable(f"cannot build the clean Debian 12 root: {exc}")
    top = Path(tempfile.mkdtemp(prefix="imexfresh-", dir="/var/tmp"))
    try:
        yield FreshRoot(base, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_fresh_machine_runs_setup_demo_and_the_demo(fresh: FreshRoot) -> None:
    """``bash .ci/setup demo && /opt/imexctl/bin/imexctl demo``, as the README says, exits 0 on a fresh machine
    and the demo finds nothing left behind."""
    assert fresh.head == _git(REPO, "rev-parse", "HEAD")
    fresh.run(f"cd {CLONE} && bash .ci/setup demo", timeout=SETUP_TIMEOUT)
    out = fresh.run(f"cd {CLONE} && /opt/imexctl/bin/imexctl demo", timeout=DEMO_TIMEOUT, netns=True)
    assert "after the epilogs: nothing left (no daemon, no file, no channel)" in out
    print(f"freshroot: seconds per command: {fresh.seconds}")


def test_fresh_machine_runs_setup_test_up_to_the_suite(fresh: FreshRoot) -> None:
    """``bash .ci/setup test`` completes on a fresh machine (Debian packages, the venvs, the bench's, the job
    user), and the README's test command collects the suite there (``python -m tests -- --collect-only``)."""
    assert fresh.head == _git(REPO, "rev-parse", "HEAD")
    fresh.run(f"cd {CLONE} && bash .ci/setup test", timeout=SETUP_TIMEOUT)
    # each venv was made and stamped by this run (a failed install leaves no stamp: .ci/venv.sh)
    versions = [ln.split("=")[0] for ln in (REPO / ".ci/nvml-versions").read_text().splitlines() if ln and ln[0] != "#"]
    venvs = ["/opt/imexctl", "/opt/imexctl-bench", *(f"/opt/imexctl-nvml/{v}" for v in versions)]
    assert [v for v in venvs if not fresh.file(f"{v}/.imexctl-venv").is_file()] == []
    assert "\nimexlab:x:1501:" in fresh.file("/etc/passwd").read_text()
    # the background build of the labs' roots started in the root, into the root's own cache (and was killed)
    assert fresh.file("/var/cache/imexctl-lab/build.log").is_file()
    out = fresh.run(f"cd {CLONE} && /opt/imexctl/bin/python -m tests -- --collect-only -q", timeout=DEMO_TIMEOUT)
    # tests/__main__.py's last lines: each part's exit and pytest's summary
    parts = re.findall(r"^tests: ([\w.-]+): exit 0: \d+/\d+ tests collected", out, flags=re.MULTILINE)
    assert sorted(parts) == sorted(PARTS), out[-3000:]
    print(f"freshroot: seconds per command: {fresh.seconds}")
