"""Files written as root in shared directories: atomic, no symlink following."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

__all__ = [
    "atomic_write",
    "check_private_dir",
    "ensure_dir",
    "flock_held",
    "open_regular",
    "read_text_nofollow",
    "remove_file",
    "remove_tree",
]


def ensure_dir(path: Path, mode: int = 0o755, *, private_from: Path | None = None) -> bool:
    """Create ``path`` (and parents) as real directories; never accept a symlink.

    Args:
        path: the directory.
        mode: for the directories created now: exactly this mode, whatever the
            process's umask (slurmd runs the hooks under its own, 027 at some
            sites: a ``0755`` that came out ``0750`` hid the job's state and
            channel from the job's user, issue 33).
        private_from: from this directory down (it and every component below it on the
            way to ``path``), each directory must be ours: see :func:`check_private_dir`.
            Checked before anything is created inside it.  Such a directory that
            lacks some of ``mode``'s bits (made under a strict umask by an earlier
            version) gets them: imexctl's own run directory is read by the job's user.

    Returns:
        True if the last component was created now.

    Raises:
        OSError: a component exists and is not a directory (symlinks included), or
            (``EPERM``) a private one is not ours; ``filename`` names the component.
    """
    created = False
    for part in [*reversed(path.parents), path]:
        try:
            os.mkdir(part, mode)
            created = part == path
            _chmod_dir(part, mode)
        except FileExistsError:
            pass
        if private_from is not None and (part == private_from or private_from in part.parents):
            check_private_dir(part)
            if stat.S_IMODE(os.lstat(part).st_mode) & mode != mode:
                _chmod_dir(part, stat.S_IMODE(os.lstat(part).st_mode) | mode)
            continue
        st = os.lstat(part)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "exists and is not a directory (symlink?)", str(part))
    return created


def _chmod_dir(path: Path, mode: int) -> None:
    """Give the directory ``path`` exactly ``mode``: through a descriptor opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def check_private_dir(path: Path) -> None:
    """Refuse a directory that anybody but this process's user (root, for the hooks) could change.

    It must be a real directory (not a symlink), owned by the effective uid and not
    writable by group or others: whoever can write a directory can replace what is in it.

    Raises:
        OSError: ``ENOTDIR`` or ``EPERM``, with ``filename`` the directory and the owner and
            mode in the message.
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise OSError(errno.ENOTDIR, f"is {what}, where a directory of root's belongs", str(path))
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(
            errno.EPERM,
            "must be owned by root and not writable by group or others "
            f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
            str(path),
        )


def atomic_write(path: Path, data: str, *, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir).

    The temporary file is ``mkstemp``'s: a random name beside ``path``, created
    exclusively (``O_EXCL``, never through a symlink), mode ``0600`` until the
    ``fchmod``.  An existing symlink at ``path`` is replaced, never followed.
    Identical content is left alone.

    Returns:
        True if the file changed.

    Raises:
        OSError: with ``filename`` the target ``path`` (not the temporary name), e.g.
            a full (``ENOSPC``) or read-only (``EROFS``) file system; nothing is left.
    """
    raw = data.encode()
    if _holds(path, raw, mode):
        return False
    try:
        _replace(path, raw, mode)
        _fsync_dir(path.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    return True


def _holds(path: Path, raw: bytes, mode: int) -> bool:
    """Whether ``path`` is a regular file with exactly ``raw`` and ``mode``, reading at most ``len(raw) + 1`` bytes.

    A file of another size is not read at all: whoever may write the
    directory (node_exporter's, for the metrics) could leave a sparse file of
    a gibibyte there, which a whole read cost every hook 2 GiB and 7 s (issue 33).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(raw) or stat.S_IMODE(st.st_mode) != mode:
            return False
        return os.read(fd, len(raw) + 1) == raw
    except OSError:
        return False
    finally:
        os.close(fd)


def _replace(path: Path, raw: bytes, mode: int) -> None:
    # What tempfile.mkstemp does (a random name, O_EXCL, O_NOFOLLOW, mode 0600), without its import of
    # shutil, random, bz2 and lzma (about 2 ms of every prolog).  64 random bits: a name taken already
    # (O_EXCL refuses it, a symlink included) is an error, not a retry.
    tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise


@contextlib.contextmanager
def flock_held(
    fd: int,
    timeout_s: float,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    pause_s: float,
    stuck: Exception,
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``fd`` (closed at the end), tried every ``pause_s`` for ``timeout_s``.

    ``stuck`` is raised when it stayed held that long.  The clock and the sleep
    are the caller's (a ``Host``'s in the hooks, so the tests' fake time applies).
    """
    import fcntl

    try:
        deadline = clock() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    raise stuck from None
                sleep(pause_s)
        yield
    finally:
        os.close(fd)


def open_regular(path: Path) -> int:
    """A descriptor of the regular file ``path``, open for reading: never through a symlink, never waiting.

    Raises:
        OSError: ``ELOOP`` "is a symbolic link (not followed)", ``EINVAL`` "not a
            regular file" (a FIFO, a device, a directory), or as ``open`` failed;
            ``filename`` is ``path``.  Nothing is left open.
    """
    # O_NONBLOCK: opening a FIFO would otherwise block until a writer appears;
    # it has no effect on reading regular files.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # what O_NOFOLLOW reports for a symlink: say so
            raise OSError(errno.ELOOP, "is a symbolic link (not followed)", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_text_nofollow(path: Path, *, trusted: bool = False) -> str:
    """Read a regular UTF-8 file, refusing symlinks and other file types.

    Args:
        path: the file.
        trusted: also refuse a file owned by anyone but root (or this process's
            user), or writable by group or others: for files that decide where
            the job's daemons connect (hosts file, topology file).

    Raises:
        OSError: also for a file that is not UTF-8 text (``EILSEQ``), so callers
            that handle unreadable files handle this one too.
    """
    with os.fdopen(open_regular(path), "rb") as f:
        st = os.fstat(f.fileno())
        if trusted and (st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022):
            raise OSError(
                errno.EPERM,
                "must be owned by root and not writable by group or others "
                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                str(path),
            )
        data = f.read()
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise OSError(errno.EILSEQ, "not UTF-8 text", str(path)) from None


def remove_file(path: Path) -> bool:
    """Unlink ``path`` (a symlink is removed itself, never its target).

    Returns:
        True if something was removed.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


#: how often :func:`remove_tree` lists a directory again that gained an entry while it was being emptied
_RMDIR_TRIES = 5


def remove_tree(path: Path) -> bool:
    """Remove a directory tree without following symlinks anywhere.

    Another process may write into the directory meanwhile without the node
    lock: the epilog records ``ended`` in ``state.json`` (a temporary file
    renamed into place) before it waits for the lock, while a ``cleanup`` or a
    prolog's claim that holds the lock removes the same job directory.  An
    entry that vanishes under the removal is fine, and a directory that got a
    new entry is emptied again (a few times; an atomic write adds at most two).
    The writer's own write then fails (the directory is gone) and it knows
    that may happen.

    Returns:
        True if something was removed.

    Raises:
        OSError: as the removal met it; ``ENOTEMPTY`` when entries kept
            appearing ``_RMDIR_TRIES`` times.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        remove_file(path)
        return True
    tries = 0
    while True:
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return True  # removed meanwhile by another holder of the path
        for entry in entries:
            child = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                remove_tree(child)
            else:
                remove_file(child)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            tries += 1
            if exc.errno != errno.ENOTEMPTY or tries >= _RMDIR_TRIES:
                raise
            continue
        return True


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
