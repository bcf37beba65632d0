"""Node-local state: the per-node lock, and each job's ``state.json`` (its schema: :mod:`imexctl.config.jobstate`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from imexctl.config import jobstate
from imexctl.config.jobstate import JobState
from imexctl.config.paths import JobDir
from imexctl.platform.errors import FileError, LockTimeout
from imexctl.platform.fsutil import atomic_write, ensure_dir, flock_held, read_text_nofollow
from imexctl.platform.host import Host

__all__ = ["JobState", "hooks_idle", "job_ids", "mark_state", "node_lock", "read_state", "write_state"]


def write_state(jd: JobDir, state: JobState) -> None:
    """Record the job's state atomically (``config.jobstate``, the file's one schema)."""
    atomic_write(jd.state, jobstate.encode(state), mode=0o644)


def mark_state(jd: JobDir, *, set_up: float = 0.0, ended: float = 0.0, deadline: float = 0.0) -> bool:
    """Record when the prolog finished setting up or the epilog began, in the job's state; False without one.

    ``deadline``, with ``ended``: by when that epilog has finished at the latest
    (``jobs.epilog_pending`` reads it).

    Raises:
        OSError: the state cannot be written.
    """
    state = read_state(jd)
    if state is None:
        return False
    marked = state._replace(set_up=set_up or state.set_up, ended=ended or state.ended)
    write_state(jd, marked._replace(epilog_deadline=deadline or state.epilog_deadline))
    return True


def read_state(jd: JobDir) -> JobState | None:
    """The recorded state, or None when absent or not what a prolog writes (the epilog must cope)."""
    try:
        return jobstate.decode(read_text_nofollow(jd.state))
    except (OSError, jobstate.StateInvalid):
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
    The kernel releases a ``flock`` when its holder dies, so a lock file left
    by a killed hook is no obstacle.
    """
    stuck = LockTimeout(f"another imexctl holds {path} for more than {timeout_s:g}s")
    with flock_held(_open_lock(path), timeout_s, clock=host.monotonic, sleep=host.sleep, pause_s=0.02, stuck=stuck):
        yield


@contextlib.contextmanager
def hooks_idle(path: Path, *, create: bool = True) -> Iterator[bool]:
    """Try the node lock once, never waiting: True while it is held here, False while a hook holds it.

    For the admin's checks (``imexctl health``, ``imexctl doctor``): a
    prolog or epilog that holds the lock is mid-flight, and what it has
    written so far (a state before its mark, a daemon being stopped) is no
    fault.  Held here, no hook can start until the block ends, so keep the
    block short: a prolog waits for it (``[daemon] lock_timeout_s``).

    ``create=False`` (doctor, which writes nothing): without a lock file no
    hook has run since the run directory was made, and the block runs
    unlocked (True).

    Raises:
        FileError: the lock file is unsafe, as the hooks refuse it.
    """
    import fcntl

    try:
        fd = _open_lock(path, create=create)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _open_lock(path: Path, *, create: bool = True) -> int:
    """Open (or create) the lock file; refuse a symlink and a file that others could open.

    Anyone who can open the file can ``flock`` it and hold every hook of the
    node back, so it must be a regular file of ours with no access for group
    or others (we create it 0600).  ``create=False``: open it read-only, and
    raise ``FileNotFoundError`` when it is absent (no directory is made).

    Raises:
        FileError: it cannot be opened, or is not such a file.
    """
    try:
        if create:
            # the run directory holds the lock and every job's state: root's alone, or refused
            ensure_dir(path.parent, 0o755, private_from=path.parent)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if not create and exc.errno == errno.ENOENT:
            raise
        why = "is a symbolic link (not followed)" if exc.errno == errno.ELOOP else exc.strerror
        where = f"{exc.filename}: " if exc.filename and exc.filename != str(path) else ""
        raise FileError(f"cannot open the node lock {path}: {where}{why}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise FileError(
            f"the node lock {path} must be a regular file owned by uid {os.geteuid()} with mode 0600, not "
            f"{_kind(st.st_mode)} of uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: "
            "others could hold the lock; remove it"
        )
    return fd


def _kind(mode: int) -> str:
    return "a regular file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
