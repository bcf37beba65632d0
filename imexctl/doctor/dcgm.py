"""Doctor's view of the DCGM installed on the tray: its version, and which shipped health-watch settings apply.

On a tray with imexctl DCGM reads the IMEX daemon status as -3 all the time (design.md source
dcgm-imex), so whichever health system carries DCGM's IMEX check raises incident 122 there.  Which
one that is depends on the version (design.md source dcgm-health): none before 4.5, the NVLink watch
in 4.5 and 4.6, a system of its own (``DCGM_HEALTH_WATCH_IMEX``) from 4.7.  The packages ship a
setting for each range under :data:`SETTINGS` (``pkg/dcgm/``); :data:`SPANS` names them.

The version is read, never asked of a program: dpkg's status file (``datacenter-gpu-manager-4-core``,
or DCGM 3's ``datacenter-gpu-manager``), else the versioned name of the library the core package
installs (``libdcgm.so.4.6.0``) in the directories the packages use, both under ``[paths] root``.
What the running hostengine watches only it can say, through its groups: doctor names the command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final, NamedTuple

from imexctl.doctor.framework import OK, WARN
from imexctl.platform.fsutil import read_text_nofollow

__all__ = ["SETTINGS", "SPANS", "Found", "Span", "find", "judge", "span_of"]

#: where the packages install the settings (pkg/dcgm/, docs/install.md)
SETTINGS: Final = "/usr/share/imexctl/dcgm"
#: the packages whose version is DCGM's: 4.x's core package, and 3.x's only one (4.x's conflicts with it)
_PACKAGE: Final = re.compile(r"datacenter-gpu-manager(?:-4-core)?")
#: dpkg's ``Version:`` field, ``[epoch:]upstream[-revision]``: the upstream version's leading numbers
_DPKG_VERSION: Final = re.compile(r"(?:\d+:)?(\d+(?:\.\d+)+)")
#: where the core package puts ``libdcgm.so.<version>``: EL's libdir, Debian's and Ubuntu's multiarch ones
LIBDIRS: Final = ("/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
_LIBRARY: Final = re.compile(r"libdcgm\.so\.(\d+\.\d+\.\d+)")
_CHECK: Final = "what the hostengine watches: dcgmi health -f -g <id>, for each group of dcgmi group -l"


class Span(NamedTuple):
    """A range of DCGM versions: its section of ``dcgmi-health.txt``, what judges IMEX there, its setting."""

    label: str
    first: tuple[int, ...]
    imex: str
    command: str
    advice: str


#: first version of each range, newest last (design.md source dcgm-health)
SPANS: Final = (
    Span("4.4 and before", (0,), "no health watch judges IMEX", "dcgmi health -s a", "it keeps NVLink"),
    Span(
        "4.5-4.6",
        (4, 5),
        "the NVLink watch judges IMEX too: incident 122 on every tray while NVLink is watched",
        "dcgmi health -s a",
        "it keeps NVLink; leave incident 122 out of automated actions",
    ),
    Span(
        "4.7 and later",
        (4, 7),
        "IMEX is a watch of its own (0x2000), which incident 122 comes from",
        "dcgmi health -s pmitdnx",
        "it keeps NVLink and leaves IMEX out",
    ),
)


class Found(NamedTuple):
    """One DCGM install: its version and where that was read."""

    version: tuple[int, ...]
    text: str
    where: str


def span_of(version: tuple[int, ...]) -> Span:
    """The range that holds ``version``."""
    return [span for span in SPANS if span.first <= version][-1]


def find(root: Path) -> list[Found]:
    """The DCGM installs under ``root``: dpkg's installed package, else each versioned library."""
    try:
        status = read_text_nofollow(root / "var/lib/dpkg/status")
    except OSError:
        status = ""
    packaged = _dpkg(status)
    return packaged or _libraries(root)


def _dpkg(status: str) -> list[Found]:
    out = []
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        name, state, field = fields.get("Package", ""), fields.get("Status", "").split(), fields.get("Version", "")
        number = _DPKG_VERSION.match(field)
        if _PACKAGE.fullmatch(name) and state[-1:] == ["installed"] and number:
            out.append(Found(_numbers(number.group(1)), number.group(1), f"dpkg: {name} {field}"))
    return out


def _libraries(root: Path) -> list[Found]:
    out = []
    for libdir in LIBDIRS:
        try:
            names = sorted(os.listdir(root / libdir.lstrip("/")))
        except OSError:
            continue
        for name in names:
            found = _LIBRARY.fullmatch(name)
            if found:
                out.append(Found(_numbers(found.group(1)), found.group(1), f"{libdir}/{name}"))
    return out


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def judge(found: list[Found]) -> tuple[str, str, str]:
    """(status, message, fix) for the installs ``find`` returned."""
    if not found:
        where = f"dpkg's status, libdcgm.so.<version> in {', '.join(LIBDIRS)}"
        why = f"no DCGM installed here ({where}); a hostengine elsewhere reads this tray alike: {SETTINGS}/"
        return OK, why, ""
    versions = sorted({f.version for f in found})
    if len(versions) > 1:
        listed = ", ".join(f"{f.text} ({f.where})" for f in sorted(found))
        why = f"DCGM {listed}: which one runs is not known, nor which settings of {SETTINGS} apply"
        return WARN, why, "remove the DCGM that does not run (its package, or its library)"
    one = found[0]
    span = span_of(one.version)
    why = (
        f"DCGM {one.text} ({one.where}): {span.imex}; use {span.command} ({span.advice}): "
        f"{SETTINGS}/dcgmi-health.txt [{span.label}], with dcgm-exporter-counters.csv and nvsentinel-values.yaml; "
        f"{_CHECK}"
    )
    return OK, why, ""
