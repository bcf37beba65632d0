"""Fixtures of the live-gauge tests (test_live.py, test_live_versions.py): a config with metrics on."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from imexctl.config.settings import Settings


@pytest.fixture
def prom_dir(root: Path) -> Path:
    """node_exporter's textfile directory under the tray's root."""
    path = root / "var/lib/node_exporter"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def cfg(make_settings: Callable[..., Settings], prom_dir: Path) -> str:
    """A config with metrics on: [metrics] textfile_dir (under [paths] root)."""
    return str(make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"}).source)
