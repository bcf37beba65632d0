#!/usr/bin/python3
"""Lay out imexctl's installed files under DESTDIR: the one build step of the .deb and the .rpm.

The layout (docs/install.md, "What the packages install"):

    /opt/imexctl/packaged/<version>/  a virtual environment for the target's /usr/bin/python3, as shipped, <version>
      being the package's whole version (``--package-version``: the Debian revision or the RPM release with it):
      pyvenv.cfg, bin/python3 -> /usr/bin/python3, bin/imexctl, BUILD (the tree's digest),
      lib/pythonX.Y/site-packages/ imexctl (without the simulator and the demo) and its dependencies;
      its scripts name /opt/imexctl/versions/<version>/bin/python3, where libexec/imexctl-switch puts
      its copy (never run from here: the package manager removes it at the next upgrade); two builds of
      one upstream version (a new Debian revision) never share a directory
    /opt/imexctl/libexec/imexctl-switch  judges the tray with the new version, then switches the link
                                   /opt/imexctl/current to versions/<version> by one rename (pkg/imexctl-switch)
    /opt/imexctl/bin/imexctl -> ../current/bin/imexctl   what the hooks and units run
    /opt/imexctl/bin/python3, python   the interpreter of the version in use, resolved once (pkg/python3-wrapper)
    /usr/sbin/imexctl -> /opt/imexctl/bin/imexctl
    /usr/share/imexctl/hooks/      prolog, epilog, health, task-prolog, enroot/99-imexctl.sh (installed nowhere else)
    <unitdir>/                     imexctl-imex@.service, imexctl-cleanup.service, imexctl-metrics.service and
                                   imexctl-metrics.timer (none enabled)
    /usr/share/imexctl/systemd/no-hardening.conf  the drop-in that turns the daemon unit's sandbox off
    /usr/share/imexctl/systemd/port-guard.slice.conf, port-guard.scope.conf  the port guard's drop-ins for
                                   user.slice and slurmstepd.scope (docs/security.md; installed by the admin)
    /usr/share/imexctl/prometheus/ imexctl.rules.yml (alert rules for the metrics, docs/operations.md),
                                   alertmanager.yml (their route, grouped by block), imexctl.dashboard.json (Grafana)
    /usr/share/imexctl/dcgm/       dcgmi-health.txt, dcgm-exporter-counters.csv, nvsentinel-values.yaml: DCGM's health
                                   watches with NVLink kept and IMEX left out, per DCGM version (docs/metrics.md)
    /etc/imexctl/imexctl.conf      pkg/imexctl.conf: sets nothing, the same text in every release
    /etc/nhc/scripts/imexctl.nhc   LBNL NHC's check_imexctl_health (the same text in every release)
    /usr/share/imexctl/imexctl.conf.example  every key commented out (python3 -m imexctl.cli.reference config)
    /etc/logrotate.d/imexctl       imexctl's log and the IMEX daemon's log
    /usr/share/man/man8/imexctl.8  from the argparse definitions (python3 -m imexctl.cli.reference man)
    /usr/share/man/man5/imexctl.conf.5  every key from the schema, meanings from docs/configuration.md
    /usr/share/doc/imexctl/        README.md and docs/*.md

The environment is built by hand rather than by ``python3 -m venv`` so that it
can be made for another Python than the build host's (the RPM for Rocky 9's
3.9 is built on Debian) and at its final path without living there: pip
installs binary wheels for ``--python-version``/``--platform`` with
``--target``, and the ``bin/`` scripts name ``/opt/imexctl/versions/<version>/bin/python3``.
Byte-code is compiled by ``imexctl-switch``, with the target's interpreter, in
the copy that runs; the package's files hold none.  The dependencies are the
versions of ``pkg/requirements.lock``, checked against its hashes, from the
package index or, offline, from ``--wheels DIR`` (``python3 pkg/wheels.py
download DIR`` makes it).  Run with the build host's python3 from the source
tree's top directory.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheels import locked_for, target_args  # pkg/wheels.py, beside this file

PREFIX = "/opt/imexctl"
SRC = Path(__file__).resolve().parent.parent


def version() -> str:
    """The version of the source tree's imexctl (``imexctl/__init__.py``)."""
    found = re.search(r'^__version__ = "([^"]+)"$', (SRC / "imexctl/__init__.py").read_text(), re.MULTILINE)
    if found is None:
        sys.exit("stage: imexctl/__init__.py has no __version__ line")
    return found.group(1)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--destdir", required=True, type=Path)
    p.add_argument("--python-version", default="{}.{}".format(*sys.version_info[:2]), help="target X.Y")
    p.add_argument("--arch", default=os.uname().machine, help="x86_64 or aarch64")
    p.add_argument("--unitdir", default="/usr/lib/systemd/system")
    p.add_argument(
        "--wheels", type=Path, help="install only from the wheels in this directory (offline; pkg/wheels.py)"
    )
    p.add_argument(
        "--package-version",
        type=_package_version,
        help="the package's whole version, which names its directories (default: imexctl's own version)",
    )
    return p.parse_args(argv)


#: a Debian version ([epoch:]upstream[-revision]) or an RPM version-release: what a directory name may hold
_PACKAGE_VERSION = re.compile(r"[0-9][0-9A-Za-z.+~:_-]*")


def _package_version(text: str) -> str:
    """``--package-version``: a package version that is safe as a directory name and in a shebang line."""
    if not _PACKAGE_VERSION.fullmatch(text) or len(text) > 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a package version (digits, letters and .+~:_- only)")
    return text


def build_wheel(out: Path) -> Path:
    """The wheel of the source tree, built by setuptools' PEP 517 backend (no network)."""
    code = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=SRC, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"stage: building the wheel failed:\n{done.stderr}")
    return out / done.stdout.strip().splitlines()[-1]


def install_site(site: Path, wheel: Path, pyver: str, arch: str, wheels: Path | None) -> None:
    """Install imexctl and the locked dependencies into ``site``, as binary wheels for the target Python and machine.

    The dependencies come from pkg/requirements.lock only (``--no-deps``,
    ``--require-hashes``): the same versions in the .deb and the .rpm, on
    every build day, less those whose marker excludes ``pyver`` (tomli, only
    before Python 3.11).  imexctl's own wheel, just built from this tree, goes
    in by a second pip run (it has no hash to pin).
    """
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    argv += ["--root-user-action=ignore", "--no-deps", "--target", str(site), *target_args(pyver, arch)]
    if wheels is not None:
        argv += ["--no-index", "--find-links", str(wheels)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as reqs:
        reqs.write(locked_for(pyver))  # the lock's pins for this Python: pip would judge markers by its own
        reqs.flush()
        subprocess.run([*argv, "--require-hashes", "-r", reqs.name], check=True)
    subprocess.run([*argv, str(wheel)], check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # scripts that name the build host's interpreter
    _forget_wheel_path(site)


def _forget_wheel_path(site: Path) -> None:
    """Remove pip's direct_url.json: it records the temporary path the wheel was built in (PEP 610)."""
    for found in site.glob("imexctl-*.dist-info/direct_url.json"):
        found.unlink()
        record = found.parent / "RECORD"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(ln for ln in lines if not ln.startswith(f"{found.parent.name}/direct_url.json,")))


#: the simulator and the demo: in the wheel, left out of the node packages (docs/install.md)
NOT_ON_NODES = ("imexctl/sim", "imexctl/commands/demo.py")
SIM_SCRIPTS = ("nvidia-imex-sim", "nvidia-imex-ctl-sim")


def drop_simulator(site: Path) -> None:
    """Remove the simulator and the demo from the installed package (and from its RECORD)."""
    for rel in NOT_ON_NODES:
        path = site / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    (record,) = site.glob("imexctl-*.dist-info/RECORD")
    kept = [line for line in record.read_text().splitlines(keepends=True) if not line.startswith(NOT_ON_NODES)]
    record.write_text("".join(kept))


def make_venv(root: Path, pyver: str) -> None:
    """pyvenv.cfg and the interpreter links of a venv over the target's /usr/bin/python3."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {pyver}\n")
    for name, target in (("python3", "/usr/bin/python3"), ("python", "python3"), (f"python{pyver}", "python3")):
        (root / "bin" / name).symlink_to(target)
    (root / "lib64").symlink_to("lib")


def write_scripts(bindir: Path, prefix: str) -> list[str]:
    """bin/<name> for each console script of setup.cfg but the simulator's, run by ``prefix``'s interpreter (-I)."""
    cfg = configparser.ConfigParser()
    cfg.read(SRC / "setup.cfg", encoding="utf-8")
    names = []
    for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, _, target = (part.strip() for part in line.partition("="))
        if name in SIM_SCRIPTS:
            continue
        module, _, func = target.partition(":")
        text = f"#!{prefix}/bin/python3 -I\nimport sys\n\nfrom {module} import {func}\n\nsys.exit({func}())\n"
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
        names.append(name)
    return names


def write_build_id(tree: Path, ver: str) -> str:
    """``<tree>/BUILD``: the version and a digest of every file and link of the tree (what a switch compares)."""
    digest = hashlib.sha256()
    for path in sorted(tree.rglob("*")):
        rel = str(path.relative_to(tree))
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            digest.update(
                f"F {rel} {path.stat().st_mode & 0o777:o} ".encode() + hashlib.sha256(path.read_bytes()).digest()
            )
    text = f"imexctl {ver} {digest.hexdigest()}\n"
    (tree / "BUILD").write_text(text)
    return text


def install_switch(dest: Path, ver: str) -> None:
    """The entry points that never change with a version: the link, the interpreter wrapper, the switch."""
    top = dest / PREFIX.lstrip("/")
    (top / "bin").mkdir(parents=True, exist_ok=True)
    (top / "bin/imexctl").symlink_to("../current/bin/imexctl")
    _put(top / "bin/python3", (SRC / "pkg/python3-wrapper").read_text(), 0o755)
    (top / "bin/python").symlink_to("python3")
    _put(top / "libexec/imexctl-switch", (SRC / "pkg/imexctl-switch").read_text().replace("@VERSION@", ver), 0o755)


def _put(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def install_files(dest: Path, unitdir: str) -> None:
    """Hooks, units, the config and its example, logrotate, the man pages, the docs and the /usr/sbin link."""
    sys.path.insert(0, str(SRC))
    from imexctl.cli import reference

    for hook in ("prolog", "epilog", "health", "task-prolog", "enroot/99-imexctl.sh"):
        _put(dest / "usr/share/imexctl/hooks" / hook, (SRC / "hooks" / hook).read_text(), 0o755)
    for unit in sorted([*(SRC / "systemd").glob("*.service"), *(SRC / "systemd").glob("*.timer")]):
        _put(dest / unitdir.lstrip("/") / unit.name, unit.read_text(), 0o644)
    # not drop-ins yet: docs/security.md and docs/install.md say how to install them
    for dropin in ("no-hardening.conf", "port-guard.slice.conf", "port-guard.scope.conf"):
        _put(dest / "usr/share/imexctl/systemd" / dropin, (SRC / "systemd" / dropin).read_text(), 0o644)
    # the conffile is a fixed text: one that changed with each release would stop an unattended
    # upgrade of a node whose config was edited at dpkg's conffile prompt
    _put(dest / "etc/imexctl/imexctl.conf", (SRC / "pkg/imexctl.conf").read_text(), 0o644)
    _put(dest / "usr/share/imexctl/imexctl.conf.example", reference.default_config(), 0o644)
    _put(dest / "etc/logrotate.d/imexctl", (SRC / "pkg/logrotate").read_text(), 0o644)
    for name in ("imexctl.rules.yml", "alertmanager.yml", "imexctl.dashboard.json"):
        _put(dest / "usr/share/imexctl/prometheus" / name, (SRC / "pkg/prometheus" / name).read_text(), 0o644)
    # DCGM's health watches with IMEX left out and NVLink kept, per DCGM version (docs/metrics.md; doctor's imex.dcgm)
    for name in ("dcgmi-health.txt", "dcgm-exporter-counters.csv", "nvsentinel-values.yaml"):
        _put(dest / "usr/share/imexctl/dcgm" / name, (SRC / "pkg/dcgm" / name).read_text(), 0o644)
    # LBNL NHC's check (docs/operations.md): NHC sources /etc/nhc/scripts/*.nhc; harmless where NHC is absent
    _put(dest / "etc/nhc/scripts/imexctl.nhc", (SRC / "pkg/nhc/imexctl.nhc").read_text(), 0o644)
    _put(dest / "usr/share/man/man8/imexctl.8", reference.man_page(), 0o644)
    configuration = (SRC / "docs/configuration.md").read_text()
    _put(dest / "usr/share/man/man5/imexctl.conf.5", reference.config_man_page(configuration), 0o644)
    # the README's links (docs/...) and the pages' links to each other resolve here as in the source
    doc = dest / "usr/share/doc/imexctl"
    _put(doc / "README.md", (SRC / "README.md").read_text(), 0o644)
    for page in sorted((SRC / "docs").glob("*.md")):
        _put(doc / "docs" / page.name, page.read_text(), 0o644)
    (dest / "usr/sbin").mkdir(parents=True, exist_ok=True)
    (dest / "usr/sbin/imexctl").symlink_to(f"{PREFIX}/bin/imexctl")


def main(argv: list[str] | None = None) -> int:
    """Stage everything under ``--destdir``."""
    args = _args(argv)
    ver = args.package_version or version()
    top = args.destdir / PREFIX.lstrip("/")
    if top.exists():
        shutil.rmtree(top)
    root = top / "packaged" / ver
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        site = root / f"lib/python{args.python_version}/site-packages"
        install_site(site, wheel, args.python_version, args.arch, args.wheels)
    drop_simulator(site)
    make_venv(root, args.python_version)
    scripts = write_scripts(root / "bin", f"{PREFIX}/versions/{ver}")
    build = write_build_id(root, ver)
    install_switch(args.destdir, ver)
    install_files(args.destdir, args.unitdir)
    print(f"stage: {args.destdir}: {build.strip()}, Python {args.python_version} {args.arch}, scripts {scripts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
