"""How DCGM reads IMEX, step for step, for the tests: what fields 1502/1503 and incident 122 say of a tray.

Written from NVIDIA/DCGM (the fields from tag v4.4.2, the health watch's incident from v4.5.0, the same at
v4.6.0, commit 72fa3fe), no code copied:

- ``dcgmlib/src/DcgmImexManager.cpp``: ``nvidia-imex-ctl -N -j`` and ``nvidia-imex-ctl -q``, found in
  ``/usr/bin`` and other trusted directories, **without** ``-c`` (so against ``/etc/nvidia-imex/config.cfg``),
  each run by ``RunCmdAndGetOutputWithTimeout`` with a 30 s limit.  A timeout or any other error of the run
  gives the domain ``UNAVAILABLE`` and the daemon ``COMMAND_ERROR`` (-3) *before* the output is looked at;
  only a run that succeeded and printed "Failed to read node configuration file" gives ``NOT_CONFIGURED``.
  The domain is the value after the *last* ``"status":`` in the output, upper-cased (UP, DOWN, DEGRADED;
  anything else UNAVAILABLE); the daemon is the whole output, trimmed and upper-cased, one of the eight
  ``-q`` states (anything else UNAVAILABLE).
- ``common/DcgmUtilities.cpp`` ``CheckChildExitStatus``: a non-zero exit (or a signal) is
  ``DCGM_ST_INIT_ERROR`` (common/ChildProcess/tests: "Non-zero exit returns INIT_ERROR").  So the real ctl's
  exit 255 with "Failed to read node configuration file" reads as a command error, not as NOT_CONFIGURED.
- ``modules/health/DcgmHealthWatch.cpp`` ``MonitorImex`` (the NVLINK watch up to 4.6, the IMEX watch from
  4.7: ``health.json`` below): the domain passes when UP,
  NOT_INSTALLED, NOT_CONFIGURED or UNAVAILABLE; the daemon passes when UNAVAILABLE (7), READY (5),
  NOT_INSTALLED (-1) or NOT_CONFIGURED (-2); anything else is incident 122 (``DCGM_FR_IMEX_UNHEALTHY``,
  "IMEX %s status is %s (%s)").

Which health system carries that check, by DCGM version, what ``dcgmi health -s`` selects, the
dcgm-exporter counters and the NVSentinel keys are recorded in ``tests/data/dcgm/health.json`` (each
block names its source); ``letters_mask``, ``imex_system`` and ``raises_122`` read them.  ``install_dpkg``
and ``install_library`` make a fake DCGM install under a tray root, as doctor reads one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "DAEMON",
    "HEALTH",
    "Reading",
    "daemon_status",
    "domain_status",
    "imex_system",
    "incidents",
    "install_dpkg",
    "install_library",
    "letters_mask",
    "raises_122",
    "read",
    "version",
]

#: the recorded facts (tests/data/README.md, ``dcgm/``)
HEALTH: dict[str, Any] = json.loads((Path(__file__).resolve().parents[1] / "data/dcgm/health.json").read_text())

NOT_CONFIGURED_TEXT = "Failed to read node configuration file"
#: DcgmImexDaemonStatus (dcgmlib/src/DcgmImexManager.h)
DAEMON = {
    "INITIALIZING": 0,
    "STARTING_AUTH_SERVER": 1,
    "WAITING_FOR_PEERS": 2,
    "WAITING_FOR_RECOVERY": 3,
    "INIT_GPU": 4,
    "READY": 5,
    "SHUTTING_DOWN": 6,
    "UNAVAILABLE": 7,
    "NOT_INSTALLED": -1,
    "NOT_CONFIGURED": -2,
    "COMMAND_ERROR": -3,
}
_DOMAIN_PASS = frozenset({"UP", "NOT_INSTALLED", "NOT_CONFIGURED", "UNAVAILABLE"})
_DAEMON_PASS = frozenset({DAEMON[s] for s in ("UNAVAILABLE", "READY", "NOT_INSTALLED", "NOT_CONFIGURED")})


class Reading(NamedTuple):
    """Field 1502 (domain, a string), field 1503 (daemon, an int) and the incidents of the IMEX check."""

    domain: str
    daemon: int
    incidents: tuple[str, ...]


def _run_ok(returncode: int | None) -> bool:
    """``RunCmdAndGetOutputWithTimeout``: DCGM_ST_OK only for exit 0 (None: timed out, or could not run)."""
    return returncode == 0


def domain_status(returncode: int | None, output: str) -> str:
    """Field 1502 from one run of ``nvidia-imex-ctl -N -j``."""
    if not _run_ok(returncode):
        return "UNAVAILABLE"
    if NOT_CONFIGURED_TEXT in output:
        return "NOT_CONFIGURED"
    at = output.rfind('"status":')
    if at < 0:
        return "UNAVAILABLE"
    start = output.find('"', at + len('"status":'))
    end = output.find('"', start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return "UNAVAILABLE"
    value = output[start + 1 : end].upper()
    return value if value in ("UP", "DOWN", "DEGRADED") else "UNAVAILABLE"


def daemon_status(returncode: int | None, output: str) -> int:
    """Field 1503 from one run of ``nvidia-imex-ctl -q``."""
    if not _run_ok(returncode):
        return DAEMON["COMMAND_ERROR"]
    if NOT_CONFIGURED_TEXT in output:
        return DAEMON["NOT_CONFIGURED"]
    state = DAEMON.get(output.strip(" \t\n\r").upper(), -1)
    return state if 0 <= state <= DAEMON["UNAVAILABLE"] else DAEMON["UNAVAILABLE"]  # only the eight -q words


def incidents(domain: str, daemon: int) -> tuple[str, ...]:
    """The IMEX check's incident 122 messages for the two fields (none: the tray passes; ``raises_122``: where)."""
    out = []
    if domain and domain not in _DOMAIN_PASS:
        out.append(f"DCGM_FR_IMEX_UNHEALTHY: IMEX domain status is {domain} (unhealthy)")
    if daemon not in _DAEMON_PASS:
        out.append(f"DCGM_FR_IMEX_UNHEALTHY: IMEX daemon status is {daemon} (not READY)")
    return tuple(out)


def read(domain_run: tuple[int | None, str], daemon_run: tuple[int | None, str]) -> Reading:
    """What DCGM makes of the two ctl runs ``(exit code or None, stdout)``."""
    domain = domain_status(*domain_run)
    daemon = daemon_status(*daemon_run)
    return Reading(domain, daemon, incidents(domain, daemon))


# ---------------------------------------------------------------- the health systems, by version


def version(text: str) -> tuple[int, ...]:
    """``"4.6.0"`` as ``(4, 6, 0)``."""
    return tuple(int(part) for part in text.split("."))


def letters_mask(tag: str, letters: str) -> int:
    """The systems ``dcgmi health -s LETTERS`` sets with the dcgmi of ``tag`` (a recorded one), as dcgmi parses.

    Refuses what that dcgmi refuses: a letter it does not know, a repeated letter, ``a`` with another.
    """
    table: dict[str, list[str]] = HEALTH["dcgmi_set_letters"][tag]
    bits: dict[str, int] = HEALTH["systems"]["bits"]
    mask = 0
    for i, letter in enumerate(letters):
        if letter not in table or (letter == "a" and len(letters) > 1):
            raise ValueError(f"dcgmi {tag}: Invalid flags detected ({letters!r})")
        if letter in letters[i + 1 :]:
            raise ValueError(f"dcgmi {tag}: Duplicate flags detected ({letters!r})")
        for system in table[letter]:
            mask |= bits[system]
    if not mask:
        raise ValueError(f"dcgmi {tag}: No flags detected")
    return mask


def imex_system(of: tuple[int, ...]) -> str | None:
    """The health system that runs DCGM's IMEX check in that version (None: no IMEX check)."""
    for span in HEALTH["imex_check"]["spans"]:
        until = span["until"]
        if version(span["from"]) <= of and (until is None or of < version(until)):
            return str(span["system"]) if span["system"] else None
    raise AssertionError(f"no recorded span holds {of}")


def raises_122(of: tuple[int, ...], mask: int, reading: Reading) -> str | None:
    """The system incident 122 is filed under, for that version, watch mask and reading (None: no incident)."""
    system = imex_system(of)
    if system is None or not mask & HEALTH["systems"]["bits"][system] or not reading.incidents:
        return None
    return system


# ---------------------------------------------------------------- a fake DCGM install under a tray root


def install_dpkg(root: Path, package: str, version_field: str, status: str = "install ok installed") -> None:
    """Add a stanza for ``package`` to dpkg's status file under ``root`` (as dpkg writes one)."""
    path = root / "var/lib/dpkg/status"
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.read_text() if path.exists() else ""
    stanza = f"Package: {package}\nStatus: {status}\nArchitecture: arm64\nVersion: {version_field}\n"
    path.write_text(before + ("\n" if before else "") + stanza)


def install_library(root: Path, libdir: str, full: str) -> Path:
    """The library a DCGM core package installs, ``libdcgm.so.<full>``, and its soname link, under ``root``."""
    where = root / libdir.lstrip("/")
    where.mkdir(parents=True, exist_ok=True)
    library = where / f"libdcgm.so.{full}"
    library.write_bytes(b"\x7fELF")
    (where / f"libdcgm.so.{full.split('.', maxsplit=1)[0]}").symlink_to(library.name)
    return library
