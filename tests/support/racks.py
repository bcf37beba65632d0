"""The tests' racks: one NVL72 rack of addresses, and simulated racks that clean up after themselves."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TypeVar

from imexctl.commands.demo import SimRack

__all__ = ["JOB_GID", "JOB_UID", "rack_addresses", "sim_racks"]

#: the simulated racks' job user and its primary group: different numbers, so a swapped owner shows
JOB_UID, JOB_GID = 4242, 4343


def rack_addresses() -> dict[str, list[str]]:
    """gb01..gb18 -> 10.0.0.1..18: one NVL72 rack, as a FakeHost resolves it (a fresh copy: tests change it)."""
    return {f"gb{i:02d}": [f"10.0.0.{i}"] for i in range(1, 19)}


R = TypeVar("R", bound=SimRack)


@contextlib.contextmanager
def sim_racks(kind: type[R], prefix: str, *, deadline_s: float = 20) -> Iterator[Callable[..., R]]:
    """A factory of racks under short temporary directories; every process is killed and every file removed at the end.

    Each rack takes a random 127.0.0.x base, so test runs sharing the machine
    do not collide on addresses and ports.
    """
    made: list[R] = []

    def make(trays: int = 2, deadline_s: float = deadline_s) -> R:
        base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        rack = kind(
            base,
            trays,
            deadline_s=deadline_s,
            uid=JOB_UID,
            gid=JOB_GID,
            first_address=random.randrange(20, 250 - trays),
        )
        made.append(rack)
        return rack

    try:
        yield make
    finally:
        for rack in made:
            rack.kill_all()
            shutil.rmtree(rack.base, ignore_errors=True)
