"""The process table, read straight from ``/proc`` one process at a time (imports only ``os``).

The hooks' fast path (:mod:`imexctl.hooks.entry`) and ``RealHost`` read the
process table here, without psutil (its import alone costs a hook about
13 ms; docs/performance.md).

Every user of the tray can start processes, with command lines of many
megabytes (issue 33: 201 forks of one process with a 6 MB argument list
made an unrelated job's epilog grow by 1.1 GiB and take 2.2 s, when the
scan kept every command line at once).  So a scan holds one command line
at a time, reads at most :data:`CMDLINE_BYTES` of it, and with ``uids``
reads nothing at all of a process whose ``/proc/<pid>`` is not owned by
one of them (one ``stat``, no read).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (the fast path's start-up)
    from collections.abc import Collection, Iterator

__all__ = ["CMDLINE_BYTES", "FD_LINKS", "mentioned_in_proc", "read_cmdline", "scan", "socket_holders"]

#: the most bytes of one process's ``/proc/<pid>/cmdline`` read: four pages.  An IMEX daemon's command line
#: (``nvidia-imex -c <config>``, through an interpreter or a wrapper) and a slurmstepd's title
#: (``slurmstepd: [<job>.<step>]``) are a few hundred bytes; what lies beyond this is never read.
CMDLINE_BYTES = 16384
#: the most descriptor links :func:`socket_holders` reads in one search, over every process together: a user
#: with thousands of processes holding thousands of descriptors each costs the search this much, no more
FD_LINKS = 65536


def read_cmdline(pid: int, max_bytes: int = CMDLINE_BYTES) -> bytes:
    """The first ``max_bytes`` of ``/proc/<pid>/cmdline``, in one ``read``.

    The kernel copies only what is asked from the process's memory, so a
    process with a command line of megabytes costs no more than a short one.

    Raises:
        OSError: the process is gone, or its command line may not be read.
    """
    fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def scan(*, uids: Collection[int] | None = None, max_bytes: int = CMDLINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """Each process's pid and the first ``max_bytes`` of its command line, one process at a time.

    Args:
        uids: only processes whose effective uid is one of these (None: every
            process), judged by the owner of ``/proc/<pid>``: one ``stat``,
            and a process of another uid is skipped without a read.  The
            kernel gives that directory the effective uid even when the
            process is not dumpable (its files are root's then: proc(5)),
            so a user cannot pass for root by ``prctl``.  A process whose
            effective uid is another for a moment (a daemon of root's that
            acts as a user) is missed in that moment: a caller that must see
            it passes no ``uids``.  The real uid is ``/proc/<pid>/status``'s,
            read by callers for the few processes that matched.
        max_bytes: the most bytes read of each command line (:data:`CMDLINE_BYTES`).

    Processes gone meanwhile, or whose command line may not be read, are left out.

    Raises:
        OSError: ``/proc`` cannot be listed.
    """
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if uids is not None and os.stat(f"/proc/{name}").st_uid not in uids:
                continue
            raw = read_cmdline(int(name), max_bytes)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        yield int(name), raw


def mentioned_in_proc(arg: str, *, uids: Collection[int] | None = None) -> bool:
    """Whether a process (of ``uids``: see :func:`scan`) has ``arg`` in its command line; a superset of argv matches.

    An argv element equal to, or starting with, ``arg`` is always a substring
    of the raw bytes.  True when ``/proc`` cannot be listed (the caller then
    looks closer, and reports it).
    """
    needle = os.fsencode(arg)
    try:
        return any(needle in raw for _, raw in scan(uids=uids))
    except OSError:
        return True


def socket_holders(
    inodes: Collection[int], *, owners: Collection[int] = (), proc: str = "/proc", max_links: int = FD_LINKS
) -> dict[int, int]:
    """The pid of a process with a descriptor on each socket (``/proc/<pid>/fd/<n>`` -> ``socket:[<inode>]``).

    Processes whose ``/proc/<pid>`` one of ``owners`` owns (the sockets'
    owners, from the kernel's socket table) are searched first, the others
    after; the search ends once every inode has a holder, or after
    ``max_links`` descriptors (:data:`FD_LINKS`) in all.  A process gone
    meanwhile, or whose descriptors may not be read (another user's, to a
    caller that is not root), is passed over.  ``proc`` is where ``/proc``
    is read (a test's own tree).

    Returns:
        inode -> pid, for the inodes a holder was found of.
    """
    wanted = {f"socket:[{inode}]": inode for inode in inodes if inode}
    found: dict[int, int] = {}
    if not wanted:
        return found
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return found
    first: list[int] = []
    rest: list[int] = []
    for pid in pids:
        try:
            (first if owners and os.stat(f"{proc}/{pid}").st_uid in owners else rest).append(pid)
        except OSError:  # gone meanwhile
            continue
    left = max_links
    for pid in first + rest:
        if left <= 0 or len(found) == len(wanted):
            break
        left = _fd_links(f"{proc}/{pid}/fd", pid, wanted, found, left)
    return found


def _fd_links(fd_dir: str, pid: int, wanted: dict[str, int], found: dict[int, int], left: int) -> int:
    """Read the links of one process's descriptors into ``found`` (inode -> pid); the links still allowed."""
    try:
        with os.scandir(fd_dir) as entries:
            for entry in entries:
                if left <= 0:
                    break
                left -= 1
                try:
                    inode = wanted.get(os.readlink(entry.path))
                except OSError:  # closed meanwhile
                    continue
                if inode is not None:
                    found.setdefault(inode, pid)
    except OSError:  # gone, or not ours to read
        pass
    return left
