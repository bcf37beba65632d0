"""Fixtures for the fault tests: racks under short temporary directories, killed and removed afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from tests.faults.rack import FaultRack
from tests.support.racks import sim_racks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/faults/ carries the ``faults`` marker and needs root (device nodes, chown)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="the hooks need root (device nodes, chown)"))


@pytest.fixture
def make_rack() -> Iterator[Callable[..., FaultRack]]:
    """Build fault racks; every process started under them is killed at the end."""
    with sim_racks(FaultRack, "imxf", deadline_s=10) as make:
        yield make
