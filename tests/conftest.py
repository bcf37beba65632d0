"""Shared fixtures: a node root under a short temporary directory, fakes, settings."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config import settings
from imexctl.hooks.runtime import Runtime
from tests.support.fakes import FakeGpu, FakeHost
from tests.support.racks import rack_addresses

#: each test's own time limit: a hang fails by name (tests/support/limits.py)
pytest_plugins = ("tests.support.limits",)

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
235 nvidia-caps
Block devices:
  8 sd
"""


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def root() -> Iterator[Path]:
    """A node root with a short path (AF_UNIX socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="imx", dir="/tmp"))
    (path / "proc").mkdir()
    (path / "proc" / "devices").write_text(PROC_DEVICES)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_config(root: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """Write an imexctl.conf (root-owned, 0644) and return its path."""
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) for s, kv in sections.items())
    path = root / "imexctl.conf"
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


@pytest.fixture
def make_settings(root: Path) -> Callable[..., settings.Settings]:
    """Settings for a tray under ``root``; keyword sections override the test defaults."""

    def make(node: str = "gb01", **sections: dict[str, Any]) -> settings.Settings:
        base: dict[str, dict[str, Any]] = {
            "paths": {"root": str(root)},
            "daemon": {"backend": "exec", "kill_grace_s": 1, "stop_timeout_s": 1},
            "readiness": {"deadline_s": 5, "poll_initial_s": 0.03, "poll_max_s": 1},
        }
        for name, kv in sections.items():
            base.setdefault(name, {}).update(kv)
        return settings.load(write_config(root, base), node=node)

    return make


@pytest.fixture
def host() -> FakeHost:
    """A FakeHost that resolves gb01..gb18 to 10.0.0.1..18."""
    return FakeHost(addresses=rack_addresses())


@pytest.fixture
def real_nodes(host: FakeHost) -> FakeHost:  # the default as root: a test that needs the nodes says so
    """The host fixture, making the channel nodes it is asked for for real (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creating and removing real character device nodes needs CAP_MKNOD")
    host.real_nodes = True
    return host


@pytest.fixture
def gpu() -> FakeGpu:
    """A tray whose 4 GPUs all sit in one registered NVLink clique."""
    return FakeGpu()


@pytest.fixture
def rt(host: FakeHost, gpu: FakeGpu, make_settings: Callable[..., settings.Settings]) -> Runtime:
    """A runtime over the fakes with default test settings."""
    return Runtime(host, gpu, make_settings(), structlog.get_logger())
