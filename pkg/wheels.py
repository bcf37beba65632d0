#!/usr/bin/python3
"""The bundled dependencies' wheels: pin them with hashes (``lock``), or fetch them for an offline build (``download``).

    python3 pkg/wheels.py lock            pkg/requirements.in -> pkg/requirements.lock (needs the package index)
    python3 pkg/wheels.py download DIR    every wheel the lock names, for each target, into DIR

``download`` makes the wheelhouse for an offline build
(``IMEXCTL_WHEELS=DIR dpkg-buildpackage ...``, ``rpmbuild --define "wheels DIR" ...``,
``pkg/stage.py --wheels DIR``); pip checks each wheel against the lock's
hashes.  The targets are the Pythons and machines the packages are built
for: CPython 3.9 (EL9), 3.11 (Debian 12) and 3.13 (Debian 13) on x86_64
and aarch64; a pin with a ``python_version`` marker (tomli, only before
3.11) is locked and fetched for the targets it serves.  Run with the build
host's python3 from the source tree's top directory.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
PINS = SRC / "pkg/requirements.in"
LOCK = SRC / "pkg/requirements.lock"
PYTHONS = ("3.9", "3.11", "3.13")
ARCHES = ("x86_64", "aarch64")
# manylinux tags a wheel for glibc-based Linux may carry; RHEL 9 has glibc 2.34, Debian 12 2.36
MANYLINUX = ("manylinux2014", "manylinux_2_17", "manylinux_2_28")
LOCK_HEADER = """\
# imexctl's bundled dependencies: the versions of pkg/requirements.in, each with the sha256 of
# every wheel the .deb and the .rpm may install (CPython {pythons} on {arches}).
# Made by: python3 pkg/wheels.py lock. Do not edit; change pkg/requirements.in instead.
"""


def target_args(pyver: str, arch: str) -> list[str]:
    """The options of pip that select binary wheels for one target Python and machine."""
    nodot = pyver.replace(".", "")
    argv = ["--only-binary=:all:", "--python-version", pyver, "--implementation", "cp", "--abi", f"cp{nodot}"]
    return argv + [f"--platform={tag}_{arch}" for tag in MANYLINUX]


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """``{name: version}`` of pkg/requirements.in, for every target."""
    return {name: version for name, (version, _marker) in _pins_and_markers().items()}


def _pins_and_markers() -> dict[str, tuple[str, str]]:
    """``{name: (version, marker)}`` of pkg/requirements.in; the marker '' when the pin serves every Python."""
    out = {}
    for raw in PINS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            pin, _, marker = line.partition(";")
            name, _, version = pin.partition("==")
            out[normalize(name)] = (version.strip(), marker.strip())
    return out


def applies(marker: str, pyver: str) -> bool:
    """Whether a pin with ``marker`` ('' or ``python_version <op> "X.Y"``) is installed for CPython ``pyver``.

    pip judges a marker by the Python it runs under, not by ``--python-version``,
    so the build judges it here, for the target.

    Raises:
        ValueError: any other marker.
    """
    if not marker:
        return True
    m = re.fullmatch(r'python_version\s*(<|<=|>|>=|==|!=)\s*"([0-9]+(?:\.[0-9]+)*)"', marker)
    if not m:
        raise ValueError(f'pkg/requirements.in: marker {marker!r} is not python_version <op> "X.Y"')
    have, want = tuple(int(p) for p in pyver.split(".")), tuple(int(p) for p in m[2].split("."))
    ops = {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want, "==": have == want}
    return ops.get(m[1], have != want)  # the one left: !=


def pins_for(pyver: str) -> dict[str, str]:
    """``{name: version}`` of the pins CPython ``pyver`` gets (their markers judged for it)."""
    return {name: version for name, (version, marker) in _pins_and_markers().items() if applies(marker, pyver)}


def locked_for(pyver: str) -> str:
    """pkg/requirements.lock's entries that CPython ``pyver`` gets, markers removed: for ``pip -r``.

    Raises:
        ValueError: a lock entry is not one ``name==version [; marker]`` with its hashes.
    """
    entries = []
    for entry in LOCK.read_text().replace("\\\n", " ").splitlines():
        if entry.strip() and not entry.startswith("#"):
            spec, sep, hashes = entry.partition(" --hash=")
            if not sep:
                raise ValueError(f"{LOCK}: no hash in {entry!r}")
            pin, _, marker = spec.partition(";")
            if applies(marker.strip(), pyver):
                entries.append(f"{pin.strip()} --hash={hashes}\n")
    return "".join(entries)


def _download(dest: Path, offline_check: bool) -> None:
    wanted = _pins_and_markers()
    for pyver in PYTHONS:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as reqs:
            reqs.write(locked_for(pyver))
            reqs.flush()
            for arch in ARCHES:
                argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
                argv += [*target_args(pyver, arch), "--dest", str(dest)]
                if offline_check:
                    argv += ["--require-hashes", "-r", reqs.name]
                else:
                    argv += [f"{n}=={v}" for n, (v, marker) in wanted.items() if applies(marker, pyver)]
                subprocess.run(argv, check=True, timeout=600)


def lock() -> str:
    """The text of pkg/requirements.lock: each pin (with its marker) and the hashes of its wheels for every target."""
    wanted = _pins_and_markers()
    with tempfile.TemporaryDirectory() as tmp:
        _download(Path(tmp), offline_check=False)
        hashes: dict[str, set[str]] = {name: set() for name in wanted}
        for wheel in Path(tmp).glob("*.whl"):
            hashes[normalize(wheel.name.split("-")[0])].add(hashlib.sha256(wheel.read_bytes()).hexdigest())
    lines = [LOCK_HEADER.format(pythons=", ".join(PYTHONS), arches=" and ".join(ARCHES))]
    for name in sorted(wanted):
        version, marker = wanted[name]
        lines.append(f"{name}=={version}{f' ; {marker}' if marker else ''} \\\n")
        lines.append(" \\\n".join(f"    --hash=sha256:{digest}" for digest in sorted(hashes[name])) + "\n")
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``lock`` or ``download DIR``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("lock", help="write pkg/requirements.lock from pkg/requirements.in")
    sub.add_parser("download", help="fetch the locked wheels into DIR").add_argument("dir", type=Path)
    args = p.parse_args(argv)
    if args.command == "lock":
        text = lock()
        tmp = LOCK.with_name(f".{LOCK.name}.tmp")
        tmp.write_text(text)
        tmp.replace(LOCK)
        print(f"wheels: {LOCK.relative_to(SRC)}: {len(pins())} pins")
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        _download(args.dir, offline_check=True)
        print(f"wheels: {args.dir}: {len(list(args.dir.glob('*.whl')))} wheels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
