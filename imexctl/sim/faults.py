"""Fault switches for the simulated daemon.

Syntax (the daemon's environment: ``IMEX_SIM_FAULTS`` and/or the file named by
``IMEX_SIM_FAULTS_FILE``; never its config file, which imexctl writes):
entries ``NAME`` or ``NAME=VALUE`` separated by newlines or ``;``; ``#`` starts
a comment that runs to the end of the line; an entry may start with
``@ADDRESS `` to apply only to the daemon whose own address is ADDRESS.
Every entry is checked, also those meant for other daemons, so a typo never
passes silently.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Callable, Final

__all__ = ["FAULT_NAMES", "FaultError", "Faults", "parse_faults"]


class FaultError(ValueError):
    """A fault entry the simulator does not understand."""


@dataclasses.dataclass(frozen=True)
class Faults:
    """The switches that apply to one daemon."""

    slow_start_s: float = 0.0
    never_ready: bool = False
    crash_after_s: float | None = None
    refuse_peers: frozenset[str] = frozenset()
    hang_ctl: bool = False
    block_cmd: bool = False
    stop_delay_s: float = 0.0
    ignore_sigterm: bool = False
    version: str | None = None
    hostname: str | None = None


def _seconds(name: str, value: str | None) -> float:
    """Return a non-negative number of seconds."""
    try:
        seconds = float(value or "")
    except ValueError:
        raise FaultError(f"fault {name}={value!r}: expected a number of seconds") from None
    if seconds < 0 or not math.isfinite(seconds):
        raise FaultError(f"fault {name}={value!r}: expected a number of seconds >= 0")
    return seconds


def _text(name: str, value: str | None) -> str:
    """Return a non-empty value."""
    if not value:
        raise FaultError(f"fault {name} needs a value ({name}=...)")
    return value


def _flag(name: str, value: str | None) -> bool:
    """Refuse a value on a switch that takes none."""
    if value is not None:
        raise FaultError(f"fault {name} takes no value, got {name}={value!r}")
    return True


_CHECKS: Final[dict[str, Callable[[str, str | None], object]]] = {
    "slow_start": _seconds,
    "never_ready": _flag,
    "crash_after": _seconds,
    "refuse_peer": _text,
    "hang_ctl": _flag,
    "block_cmd": _flag,
    "stop_delay": _seconds,
    "ignore_sigterm": _flag,
    "version": _text,
    "hostname": _text,
}

#: Every switch name the simulator accepts.
FAULT_NAMES: Final = frozenset(_CHECKS)


def _entries(text: str) -> Iterable[str]:
    """Yield the non-empty entries of ``text`` with comments removed."""
    for line in text.splitlines():
        for entry in line.split("#", 1)[0].split(";"):
            if entry.strip():
                yield entry.strip()


def _split(entry: str) -> tuple[str | None, str, str | None]:
    """Return ``(address or None, name, value or None)`` of one entry."""
    target = None
    if entry.startswith("@"):
        target, _, entry = entry[1:].partition(" ")
        entry = entry.strip()
        if not target or not entry:
            raise FaultError(f"fault entry '@{target} {entry}': expected '@ADDRESS NAME[=VALUE]'")
    name, sep, value = entry.partition("=")
    name = name.strip()
    if name not in _CHECKS:
        known = ", ".join(sorted(_CHECKS))
        raise FaultError(f"unknown fault {name!r} (known: {known})")
    return target, name, value.strip() if sep else None


def parse_faults(texts: Iterable[str], own_addresses: Iterable[str]) -> Faults:
    """Parse fault texts and keep the entries for this daemon.

    Args:
        texts: fault texts (env value, file content), later ones win.
        own_addresses: the forms of this daemon's address (nodes-file entry,
            resolved IP) that an ``@ADDRESS`` prefix may name.

    Raises:
        FaultError: an entry has an unknown name or a bad value.
    """
    mine = set(own_addresses)
    values: dict[str, object] = {}
    refused: set[str] = set()
    for text in texts:
        for entry in _entries(text):
            target, name, raw = _split(entry)
            value = _CHECKS[name](name, raw)
            if target is not None and target not in mine:
                continue
            if name == "refuse_peer":
                refused.add(str(value))
            else:
                values[name] = value
    return Faults(
        slow_start_s=float(values.get("slow_start", 0.0)),  # type: ignore[arg-type]
        never_ready=bool(values.get("never_ready", False)),
        crash_after_s=values.get("crash_after"),  # type: ignore[arg-type]
        refuse_peers=frozenset(refused),
        hang_ctl=bool(values.get("hang_ctl", False)),
        block_cmd=bool(values.get("block_cmd", False)),
        stop_delay_s=float(values.get("stop_delay", 0.0)),  # type: ignore[arg-type]
        ignore_sigterm=bool(values.get("ignore_sigterm", False)),
        version=values.get("version"),  # type: ignore[arg-type]
        hostname=values.get("hostname"),  # type: ignore[arg-type]
    )
