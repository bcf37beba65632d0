"""The packages' versions of imexctl on this tray: the one in use, the one installed, and a refused switch.

The .deb and the .rpm keep each version in a directory named by the
package's whole version (its Debian revision or RPM release with it;
pkg/stage.py), and their switch (pkg/imexctl-switch) leaves these facts
(docs/operations.md, "Upgrading imexctl while jobs run"):

- ``/opt/imexctl/packaged/<version>/BUILD``: the installed package's build,
  one line ``imexctl <version> <digest of its tree>``;
- ``/opt/imexctl/current``: a link to ``versions/<version>``, the version in
  use, whose ``BUILD`` is the copy's;
- ``/opt/imexctl/refused``: while the installed version's switch is refused,
  ``key=value`` lines: ``version``, ``build`` (its BUILD line), ``active``,
  ``why`` (:data:`WHYS`), ``time`` (Unix time) and ``reason`` (the switch's
  words, one line).  The refusal does not fail the package's script, which
  would stop every later apt-get on the tray (design.md source dpkg-postinst):
  this record is how it is seen.

:func:`read` reads them for ``imexctl --version`` (:func:`version_line`, in
the hooks' fast tier: this module imports only ``os`` and ``sys``),
``imexctl doctor`` (``imexctl.version``) and the live gauges
(``imexctl_live_version_pending``, :func:`pending`).  A record is believed
only where the facts agree with it: its build is installed and is not the
one in use.  A tray without these files (a virtual environment, a checkout)
has no package's versions.
"""

from __future__ import annotations

import os
import sys

from imexctl.platform import Record

__all__ = ["SWITCH", "TOP", "WHYS", "Build", "Pending", "Refusal", "Versions", "pending", "read", "version_line"]

TOP = "/opt/imexctl"
#: the switch, to run by hand once what it refused is fixed
SWITCH = TOP + "/libexec/imexctl-switch"
#: the ``why`` of a version installed and not in use: what it means (the ``reason`` label of the gauge)
WHYS = {
    "config": "the new version cannot read the tray's config",
    "nvidia_imex": "nvidia-imex is not the loaded driver's version",
    "preflight": "the new version's imexctl preflight failed",
    "rebuilt": "another build of the same version is in use",
    "not_switched": "the package's switch has not run, or did not finish",
}
#: what a package version may hold (pkg/stage.py): safe in a label and a line of text
_VERSION_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+~:_-")


class Build(Record):
    """One build of imexctl: the package's whole version and the digest of its tree (its ``BUILD`` line)."""

    version: str
    digest: str

    @property
    def line(self) -> str:
        """The ``BUILD`` line, as the switch records it."""
        return f"imexctl {self.version} {self.digest}"


class Refusal(Record):
    """The switch's record of the installed version it refused (``/opt/imexctl/refused``)."""

    version: str
    build: str
    active: str
    why: str
    time: int
    reason: str


class Versions(Record):
    """The packages' versions on this tray: what runs here, what is in use, what is installed, a refusal."""

    #: the build this process runs (None: not a package's version directory)
    running: Build | None = None
    #: the build ``current`` leads to (None: no link, or it leads nowhere)
    active: Build | None = None
    #: the installed packages' builds (one, but for a moment during rpm's upgrade)
    installed: tuple[Build, ...] = ()
    #: the switch's record, where the facts agree with it (its build is installed and not in use)
    refusal: Refusal | None = None

    @property
    def packaged(self) -> bool:
        """Whether a package's versions are on this tray at all."""
        return self.active is not None or bool(self.installed)

    @property
    def pending(self) -> tuple[Build, ...]:
        """The installed builds that are not in use."""
        return tuple(b for b in self.installed if b != self.active)

    def refused(self, build: Build) -> Refusal | None:
        """The switch's refusal of ``build``, where it recorded one."""
        return self.refusal if self.refusal is not None and self.refusal.build == build.line else None

    def why(self, build: Build) -> str:
        """Why ``build`` is installed and not in use: the refusal's ``why``, else ``not_switched``."""
        found = self.refused(build)
        return found.why if found is not None else "not_switched"


class Pending(Record):
    """One sample of ``imexctl_live_version_pending``: the version in use, the one installed, and why (1: pending)."""

    active: str
    installed: str
    reason: str
    value: int


def read(top: str = TOP, prefix: str | None = None) -> Versions:
    """The versions under ``top`` (``[paths] root`` first, for doctor and the gauges); ``prefix``: this process's."""
    here = sys.prefix if prefix is None else prefix
    running = _build(here) if os.path.dirname(here) == os.path.join(top, "versions") else None
    active = _active(top)
    installed = tuple(b for b in (_build(os.path.join(top, "packaged", n)) for n in _names(top, "packaged")) if b)
    versions = Versions(running, active, installed)
    refusal = _refusal(os.path.join(top, "refused"))
    pending = {b.line for b in versions.pending}
    if refusal is not None and refusal.build in pending and refusal.why in WHYS:
        versions = versions._replace(refusal=refusal)
    return versions


def _names(top: str, sub: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(top, sub)) if not n.startswith("."))
    except OSError:
        return []


def _active(top: str) -> Build | None:
    """The build ``top/current`` leads to, or None."""
    try:
        target = os.readlink(os.path.join(top, "current"))
    except OSError:
        return None
    return _build(os.path.join(top, target))


def _first_line(path: str) -> str:
    """A file's first line ('' when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline(4096).rstrip("\n")
    except OSError:
        return ""


def _build(tree: str) -> Build | None:
    """The build a tree's ``BUILD`` file names, or None (no such file, or not a build's line)."""
    fields = _first_line(os.path.join(tree, "BUILD")).split(" ")
    if len(fields) != 3 or fields[0] != "imexctl" or not _version_ok(fields[1]) or not fields[2].isalnum():
        return None
    return Build(fields[1], fields[2])


def _version_ok(text: str) -> bool:
    return 0 < len(text) <= 100 and set(text) <= _VERSION_CHARS


def _refusal(path: str) -> Refusal | None:
    """The switch's record, or None (none, unreadable, or a field missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return None
    fields = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    if not all(fields.get(k) for k in ("version", "build", "why")) or not _version_ok(fields["version"]):
        return None
    time = fields.get("time", "")
    return Refusal(
        fields["version"],
        fields["build"],
        fields.get("active", "") if _version_ok(fields.get("active", "")) else "",
        fields["why"],
        int(time) if time.isdigit() else 0,
        fields.get("reason", ""),
    )


def _name(build: Build, other: Build | None) -> str:
    """``build``'s version, or "another build of <version>" beside ``other`` of the same version."""
    same = other is not None and other.version == build.version
    return f"another build of {build.version}" if same else build.version


def version_line(versions: Versions, upstream: str) -> str:
    """``imexctl --version``: ``imexctl 0.1.0-2``, with what an admin must know beside it.

    ``imexctl 0.1.0-2 (active; 0.1.0-3 installed, refused: <reason>)``; run
    from a version that is not in use, ``imexctl 0.1.0-3 (not active: the
    hooks run 0.1.0-2; refused: <reason>)``.  Outside the packages' versions,
    ``imexctl <upstream>``.
    """
    mine = versions.running
    if mine is None:
        return f"imexctl {upstream}"
    notes = ["active" if mine == versions.active else _not_active(versions.active)]
    for build in versions.pending:
        found = versions.refused(build)
        refused = f"refused: {found.reason}" if found is not None else ""
        if build != mine:
            notes.append(f"{_name(build, mine)} installed, {refused or 'not switched to'}")
        elif refused:
            notes.append(refused)
    return f"imexctl {mine.version}" if notes == ["active"] else f"imexctl {mine.version} ({'; '.join(notes)})"


def _not_active(active: Build | None) -> str:
    return f"not active: the hooks run {active.version}" if active else "not active: no version is in use"


def pending(versions: Versions, upstream: str) -> tuple[Pending, ...]:
    """The gauge's samples: one per installed build not in use (value 1), else one with value 0.

    ``active`` is the version in use (where none is, the one this process
    runs, else ``upstream``), ``installed`` the installed package's version.
    """
    active = versions.active or versions.running
    shown = active.version if active else upstream
    out = tuple(Pending(shown, b.version, versions.why(b), 1) for b in versions.pending)
    return out or (Pending(shown, shown, "", 0),)
