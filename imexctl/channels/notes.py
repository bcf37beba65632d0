"""A line for the job's own output when the job gets no IMEX domain: left by the prolog, printed by the TaskProlog.

Slurm writes nothing a prolog prints into the job's output; a TaskProlog's
``print`` lines go to the task's standard output (``src/slurmd/slurmstepd/task.c``
``_proc_stdout``).  So the prolog of a job that runs without IMEX at its own
request (it may share its trays) leaves one line in ``<run_dir>/notes/<job id>``,
``imexctl task-prolog`` prints it in the job's first task, and the epilog
removes it.

A note is left only on a tray whose driver offers IMEX channels
(``nvidia-caps-imex-channels`` in ``/proc/devices``): a job on a CPU node was
never going to get IMEX, and its user need not hear about it.

Light enough for the hooks' fast path: it imports only ``os`` and ``stat``.
Leaving a note is best effort: a job that runs without IMEX is no fault of
the tray, so a note that cannot be written never fails the prolog.
"""

from __future__ import annotations

import os
import stat

__all__ = ["DEVICE_NAME", "NOTES", "forget", "leave", "note_path", "offers_channels"]

#: the channel device class (:data:`imexctl.channels.devices.DEVICE_NAME`, not imported: start-up cost)
DEVICE_NAME = "nvidia-caps-imex-channels"
#: the notes' directory under ``[paths] run_dir``
NOTES = "notes"
_MAX_NOTE = 1000
#: the notes' directories: the job's user reads its note through them
_DIR_MODE = 0o755


def note_path(run_dir: str, job_id: int) -> str:
    """Where job ``job_id``'s note lives."""
    return os.path.join(run_dir, NOTES, str(job_id))


def offers_channels(proc_devices: str) -> bool:
    """Whether ``proc_devices`` lists the IMEX channel device class (False when it cannot be read)."""
    try:
        with open(proc_devices, encoding="ascii", errors="replace") as f:
            text = f.read(65536)
    except OSError:
        return False
    return any(line.split()[1:] == [DEVICE_NAME] for line in text.splitlines())


def leave(run_dir: str, proc_devices: str, job_id: int, text: str) -> bool:
    """Leave ``text`` (one line) for job ``job_id``'s TaskProlog; False when this tray offers no channels.

    The note is written whole, then renamed into place, in directories that
    are this user's and writable by nobody else; nothing is followed through
    a symlink.

    Raises:
        OSError: the directory or the note cannot be made safely.
    """
    if not offers_channels(proc_devices):
        return False
    line = "".join(c if c.isprintable() else "?" for c in text)[:_MAX_NOTE] + "\n"
    _make_parents(os.path.dirname(run_dir))
    fd = _open_dir(run_dir)
    try:
        sub = _open_dir(NOTES, fd)
        try:
            tmp = f".{job_id}.{os.getpid()}"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=sub)
            try:
                os.write(out, line.encode())
                os.fchmod(out, 0o644)
            finally:
                os.close(out)
            os.rename(tmp, str(job_id), src_dir_fd=sub, dst_dir_fd=sub)
        finally:
            os.close(sub)
    finally:
        os.close(fd)
    return True


def forget(run_dir: str, job_id: int) -> bool:
    """Remove job ``job_id``'s note; True when there was one (never follows a symlink)."""
    try:
        os.unlink(note_path(run_dir, job_id))
    except FileNotFoundError:
        return False
    except NotADirectoryError:  # the notes' directory is not one: nothing of ours to remove
        return False
    return True


def _make_parents(path: str) -> None:
    """``os.makedirs(path, 0o755)``, each directory made now given exactly that mode whatever the umask."""
    if not path or os.path.isdir(path):
        return
    _make_parents(os.path.dirname(path))
    try:
        os.mkdir(path, _DIR_MODE)
    except FileExistsError:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, _DIR_MODE)
    finally:
        os.close(fd)


def _open_dir(name: str, parent: int | None = None) -> int:
    """Open (making it, 0755 whatever the umask) the directory ``name``; refuse a symlink or one others may write."""
    made = True
    try:
        os.mkdir(name, _DIR_MODE, dir_fd=parent)
    except FileExistsError:
        made = False
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    if made:
        os.fchmod(fd, _DIR_MODE)  # slurmd's umask (027 at some sites) would hide the notes from the job's user
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise PermissionError(f"{name}: not a directory of uid {os.geteuid()} alone")
    return fd
