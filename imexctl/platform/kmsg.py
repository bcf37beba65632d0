"""The kernel's log as ``/dev/kmsg`` gives it: the records after a remembered sequence number, never blocking.

Each ``read`` of ``/dev/kmsg`` returns one record, ``PRIO,SEQ,USEC,FLAGS[,...];MESSAGE``
and maybe lines of ``KEY=VALUE`` that begin with a blank; it fails with
``EAGAIN`` at the end (opened ``O_NONBLOCK``) and with ``EPIPE`` when records
were overwritten while it read (the kernel's Documentation/ABI/testing/dev-kmsg).
Sequence numbers grow for the whole boot.  A regular file in that format
(the tests' fake) gives many records per read; both are split into lines.

``PRIO`` is the syslog facility times 8 plus the level.  Kernel code logs
with facility 0 (:data:`KERNEL`); a record that user space writes to
``/dev/kmsg`` never has it, as the kernel gives one without a facility
``LOG_USER`` (``devkmsg_write``), so the facility tells the kernel's own
records from anyone's.  The text of a kernel record may still quote what a
user gave it (a mount option, a file name, a command name): who wrote a
record is its facility, what it says is for its owner to match exactly.
The text is the kernel's, with every byte below a blank, above ``~`` or a
backslash escaped (a backslash, ``x`` and two hex digits): one record is one line.
"""

from __future__ import annotations

import errno
import os
from typing import Final

from imexctl.platform import Record

__all__ = ["KERNEL", "MAX_BYTES", "Entry", "read_after"]

#: bytes read at most in one call: the kernel's buffer is 128 KiB to a few MiB
MAX_BYTES = 32 << 20
#: the syslog facility of the kernel's own records (``LOG_KERN``); user space's are 1 (``LOG_USER``) and up
KERNEL: Final = 0


class Entry(Record):
    """One record: its sequence number, syslog facility, microseconds since boot, and text."""

    seq: int
    facility: int
    usec: int
    message: str


def read_after(path: str, after: int, *, max_bytes: int = MAX_BYTES) -> tuple[list[Entry], int]:
    """Every record whose sequence number is above ``after``, and the last number seen.

    The last number is ``after`` when no record was read.  Records that
    cannot be parsed are skipped.

    Raises:
        OSError: ``path`` cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    found: list[Entry] = []
    last = after
    taken = 0
    rest = b""
    try:
        while taken < max_bytes:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten under us: the next read goes on from the oldest kept
                    continue
                raise
            if not chunk:
                break
            taken += len(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                seq = _parse(line, after, found)
                last = max(last, seq)
    finally:
        os.close(fd)
    return found, last


def _parse(line: bytes, after: int, found: list[Entry]) -> int:
    """The sequence number of a record's first line; -1 for a continuation line or garbage.

    The record is added to ``found`` when its number is above ``after``: the
    records read before cost no more than their number.
    """
    if not line or line[:1] == b" ":
        return -1
    head, sep, message = line.partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 4 or not (fields[0].isdigit() and fields[1].isdigit() and fields[2].isdigit()):
        return -1
    seq = int(fields[1])
    if seq > after:
        found.append(Entry(seq, int(fields[0]) >> 3, int(fields[2]), message.decode("utf-8", "replace")))
    return seq
