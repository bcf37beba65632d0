"""The packages' versions on a tray (imexctl/platform/versions.py): what ``--version``, doctor and the live gauge read.

Each test lays out ``/opt/imexctl`` under a temporary directory as pkg/imexctl-switch leaves it: the
installed package's ``packaged/<version>/BUILD``, the copies in ``versions/``, the link ``current`` and,
after a refused switch, the record ``refused``.
"""

from __future__ import annotations

import os
from pathlib import Path

from imexctl.platform import versions

OLD, NEW = "0.1.0-2", "0.1.0-3"
REASON = "/etc/imexctl/imexctl.conf: line 3: unknown key 'deadline' in [readiness]"


def build(tree: Path, version: str, digest: str = "aa11") -> str:
    """Write a tree's BUILD line; the line."""
    tree.mkdir(parents=True, exist_ok=True)
    line = f"imexctl {version} {digest}"
    (tree / "BUILD").write_text(line + "\n")
    return line


def tray(top: Path, active: str | None, installed: str, *, digest: str = "bb22") -> None:
    """``active`` in use (its copy, the link), ``installed`` the package's (a different digest when both agree)."""
    if active is not None:
        build(top / "versions" / active, active)
        (top / "current").symlink_to(f"versions/{active}")
    build(top / "packaged" / installed, installed, "aa11" if installed == active else digest)


def refuse(top: Path, version: str, why: str = "config", *, digest: str = "bb22", active: str = OLD) -> None:
    """The switch's record, as it writes it."""
    fields = {"version": version, "build": f"imexctl {version} {digest}", "active": active, "why": why}
    fields |= {"time": "1764676800", "reason": REASON}
    (top / "refused").write_text("".join(f"{k}={v}\n" for k, v in fields.items()))


def test_without_the_packages_layout_the_version_is_imexctls_own(tmp_path: Path) -> None:
    """A virtual environment or a checkout: no package's versions, ``--version`` as ever, the gauge 0."""
    found = versions.read(str(tmp_path / "opt/imexctl"), prefix=str(tmp_path / "venv"))
    assert not found.packaged and found.pending == ()
    assert versions.version_line(found, "0.1.0") == "imexctl 0.1.0"
    assert versions.pending(found, "0.1.0") == (versions.Pending("0.1.0", "0.1.0", "", 0),)


def test_installed_and_in_use_is_the_packages_whole_version(tmp_path: Path) -> None:
    """Run from the version in use, which the package installed: its whole version, and nothing else said."""
    top = tmp_path / "opt/imexctl"
    tray(top, OLD, OLD)
    found = versions.read(str(top), prefix=str(top / "versions" / OLD))
    assert found.running == found.active == versions.Build(OLD, "aa11") and found.pending == ()
    assert versions.version_line(found, "0.1.0") == f"imexctl {OLD}"
    assert versions.pending(found, "0.1.0") == (versions.Pending(OLD, OLD, "", 0),)


def test_a_refused_switch_names_the_installed_version_and_why(tmp_path: Path) -> None:
    """The old version in use, the new one installed and refused: ``--version`` and the gauge say which and why."""
    top = tmp_path / "opt/imexctl"
    tray(top, OLD, NEW)
    refuse(top, NEW)
    found = versions.read(str(top), prefix=str(top / "versions" / OLD))
    assert found.pending == (versions.Build(NEW, "bb22"),) and found.refusal is not None
    assert found.refusal.time == 1764676800 and found.why(found.pending[0]) == "config"
    assert versions.version_line(found, "0.1.0") == f"imexctl {OLD} (active; {NEW} installed, refused: {REASON})"
    assert versions.pending(found, "0.1.0") == (versions.Pending(OLD, NEW, "config", 1),)


def test_run_from_the_refused_version_it_says_it_is_not_active(tmp_path: Path) -> None:
    """``/opt/imexctl/versions/<new>/bin/imexctl --version``: not the version the hooks run, and why."""
    top = tmp_path / "opt/imexctl"
    tray(top, OLD, NEW)
    build(top / "versions" / NEW, NEW, "bb22")
    refuse(top, NEW, "nvidia_imex")
    found = versions.read(str(top), prefix=str(top / "versions" / NEW))
    assert (
        versions.version_line(found, "0.1.0") == f"imexctl {NEW} (not active: the hooks run {OLD}; refused: {REASON})"
    )


def test_an_installed_version_never_switched_to_is_not_switched(tmp_path: Path) -> None:
    """No record (a switch that did not run), or one about another build: ``not_switched``, never the old reason."""
    top = tmp_path / "opt/imexctl"
    tray(top, OLD, NEW)
    found = versions.read(str(top), prefix=str(top / "versions" / OLD))
    assert versions.version_line(found, "0.1.0") == f"imexctl {OLD} (active; {NEW} installed, not switched to)"
    refuse(top, NEW, digest="cc33")  # a record of an earlier build of NEW, since rebuilt and installed again
    found = versions.read(str(top), prefix=str(top / "versions" / OLD))
    assert found.refusal is None
    assert versions.pending(found, "0.1.0") == (versions.Pending(OLD, NEW, "not_switched", 1),)


def test_a_record_the_facts_deny_is_not_believed(tmp_path: Path) -> None:
    """A record left after the switch was made (or of an unknown ``why``, or garbage) says nothing."""
    top = tmp_path / "opt/imexctl"
    tray(top, NEW, NEW)
    refuse(top, NEW, digest="aa11")
    assert versions.read(str(top)).refusal is None
    for text in ("version=0.1.0-3\nwhy=config\n", "garbage\n\0\n", f"version={NEW}\nbuild=imexctl {NEW} aa11\nwhy=x\n"):
        (top / "refused").write_text(text)
        assert versions.read(str(top)).refusal is None


def test_another_build_of_the_version_in_use_is_named_so(tmp_path: Path) -> None:
    """A rebuild of the version in use (same version, other contents) refused as ``rebuilt``."""
    top = tmp_path / "opt/imexctl"
    tray(top, OLD, OLD)
    build(top / "packaged" / OLD, OLD, "dd44")
    refuse(top, OLD, "rebuilt", digest="dd44")
    found = versions.read(str(top), prefix=str(top / "versions" / OLD))
    assert versions.version_line(found, "0.1.0") == (
        f"imexctl {OLD} (active; another build of {OLD} installed, refused: {REASON})"
    )
    assert versions.pending(found, "0.1.0") == (versions.Pending(OLD, OLD, "rebuilt", 1),)


def test_unreadable_build_files_and_a_dangling_link_are_no_versions(tmp_path: Path) -> None:
    """A BUILD that is not a build's line, a version with characters no package version has, a link to nowhere."""
    top = tmp_path / "opt/imexctl"
    (top / "packaged/x").mkdir(parents=True)
    (top / "packaged/x/BUILD").write_text('imexctl 0.1.0"} 1 aa\n')
    (top / "packaged/y").mkdir()
    (top / "packaged/y/BUILD").write_text("not a build\n")
    os.symlink("versions/gone", top / "current")
    found = versions.read(str(top))
    assert (found.active, found.installed, found.packaged) == (None, (), False)
