"""Node-local state: the per-node lock and the record of which job owns the domain."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imexctl.errors import FileError, LockTimeout
from imexctl.fsutil import atomic_write, ensure_dir, read_text_nofollow
from imexctl.host import Host
from imexctl.settings import JobDir

__all__ = ["JobState", "job_ids", "node_lock", "read_state", "write_state"]


@dataclasses.dataclass(frozen=True)
class JobState:
    """What a prolog set up for one job on this node (``<job dir>/state.json``)."""

    job_id: int
    node: str
    uid: int
    gid: int
    user: str
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    port: int
    backend: str
    channel_minor: int | None
    channel_path: str
    created: float
    cmd_port: int = 0


def write_state(jd: JobDir, state: JobState) -> None:
    """Record the job's state atomically."""
    data = dataclasses.asdict(state)
    atomic_write(jd.state, json.dumps(data, indent=1) + "\n", mode=0o644)


def read_state(jd: JobDir) -> JobState | None:
    """The recorded state, or None when absent or unreadable (the epilog must cope)."""
    try:
        data: dict[str, Any] = json.loads(read_text_nofollow(jd.state))
        data["nodes"], data["addresses"] = tuple(data["nodes"]), tuple(data["addresses"])
        return JobState(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def job_ids(jobs_dir: Path) -> list[int]:
    """Job ids that have a per-job directory on this node."""
    try:
        return sorted(int(e.name) for e in os.scandir(jobs_dir) if e.name.isdigit())
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def node_lock(path: Path, host: Host, timeout_s: float) -> Iterator[None]:
    """Hold the per-node lock (``flock``) for prologs, epilogs and cleanup.

    The descriptor is close-on-exec, so the daemon never inherits the lock.
    """
    import fcntl

    try:
        # the run directory holds the lock and every job's state: root's alone, or refused
        ensure_dir(path.parent, 0o755, private_from=path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and exc.filename != str(path) else ""
        raise FileError(f"cannot open the node lock {path}: {where}{exc.strerror}") from exc
    try:
        deadline = host.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if host.monotonic() >= deadline:
                    raise LockTimeout(f"another imexctl holds {path} for more than {timeout_s:g}s") from None
                host.sleep(0.02)
        yield
    finally:
        os.close(fd)
