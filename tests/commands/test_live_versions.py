"""The live gauge ``imexctl_live_version_pending``: which version is in use, which is installed, and why the switch
was refused, at each refresh (``imexctl status --textfile``), for ImexctlUpgradeRefused."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from imexctl import __version__
from tests.commands.test_live import parse, refresh
from tests.platform.test_versions import NEW, OLD, refuse, tray
from tests.support.fakes import FakeHost

NAME = "imexctl_live_version_pending"


def pending(text: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The gauge's samples: labels (without block) -> value."""
    return {labels: v for (name, labels), v in parse(text).items() if name == NAME}


def test_a_refused_switch_is_1_with_both_versions_and_why(cfg: str, host: FakeHost, prom_dir: Path, root: Path) -> None:
    """Refused: one sample, 1, naming the version in use, the installed one and the reason; switched: 0."""
    top = root / "opt/imexctl"
    tray(top, OLD, NEW)
    refuse(top, NEW)
    text = refresh(cfg, host, prom_dir)
    assert pending(text) == {(("active", OLD), ("installed", NEW), ("reason", "config")): 1.0}
    (top / "refused").unlink()
    (top / "current").unlink()
    tray(top, NEW, NEW)
    assert pending(refresh(cfg, host, prom_dir)) == {(("active", NEW), ("installed", NEW), ("reason", "")): 0.0}


def test_without_the_packages_it_is_0_with_imexctls_version(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """A virtual environment: one sample, 0; the family is in the file with its HELP and TYPE."""
    text = refresh(cfg, host, prom_dir)
    assert pending(text) == {(("active", __version__), ("installed", __version__), ("reason", "")): 0.0}
    assert NAME in {f.name for f in text_string_to_metric_families(text)}
