"""Files written as root in shared directories: atomic, no symlink following."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "ensure_dir", "read_text_nofollow", "remove_file", "remove_tree"]


def ensure_dir(path: Path, mode: int = 0o755) -> bool:
    """Create ``path`` (and parents) as real directories; never accept a symlink.

    Returns:
        True if the last component was created now.

    Raises:
        OSError: a component exists and is not a directory (symlinks included).
    """
    created = False
    for part in [*reversed(path.parents), path]:
        try:
            os.mkdir(part, mode)
            created = part == path
        except FileExistsError:
            pass
        st = os.lstat(part)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "exists and is not a directory (symlink?)", str(part))
    return created


def atomic_write(path: Path, data: str, *, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir).

    An existing symlink at ``path`` is replaced, never followed.  Identical
    content is left alone.

    Returns:
        True if the file changed.
    """
    raw = data.encode()
    try:
        if read_text_nofollow(path).encode() == raw and stat.S_IMODE(os.lstat(path).st_mode) == mode:
            return False
    except (FileNotFoundError, OSError):
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(Path(tmp))
        raise
    _fsync_dir(path.parent)
    return True


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
    # O_NONBLOCK: opening a FIFO would otherwise block until a writer appears;
    # it has no effect on reading regular files.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # what O_NOFOLLOW reports for a symlink: say so
            raise OSError(errno.ELOOP, "is a symbolic link (not followed)", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
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


def remove_tree(path: Path) -> bool:
    """Remove a directory tree without following symlinks anywhere.

    Returns:
        True if something was removed.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    for entry in os.scandir(path):
        child = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            remove_tree(child)
        else:
            os.unlink(child)
    os.rmdir(path)
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
