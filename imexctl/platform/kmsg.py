"""The kernel's log as ``/dev/kmsg`` gives it: the records after a remembered sequence number, never blocking.

Each ``read`` of ``/dev/kmsg`` returns one record, ``PRIO,SEQ,USEC,FLAGS[,...];MESSAGE``
and maybe lines of ``KEY=VALUE`` that begin with a blank; it fails with
``EAGAIN`` at the end (opened ``O_NONBLOCK``) and with ``EPIPE`` when records
were overwritten while it read (the kernel's Documentation/ABI/testing/dev-kmsg).
Sequence numbers grow for the whole boot.  A regular file in that format
(the tests' fake) gives many records per read; both are split into lines.
"""

from __future__ import annotations

import errno
import os

__all__ = ["MAX_BYTES", "read_after"]

#: bytes read at most in one call: the kernel's buffer is 128 KiB to a few MiB
MAX_BYTES = 32 << 20


def read_after(path: str, after: int, *, max_bytes: int = MAX_BYTES) -> tuple[list[tuple[int, str]], int]:
    """``(seq, message)`` of every record whose sequence number is above ``after``, and the last number seen.

    The last number is ``after`` when no record was read.  Records that
    cannot be parsed are skipped.

    Raises:
        OSError: ``path`` cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    found: list[tuple[int, str]] = []
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
                record = _parse(line)
                if record is not None and record[0] > after:
                    found.append(record)
                    last = max(last, record[0])
                elif record is not None:
                    last = max(last, record[0])
    finally:
        os.close(fd)
    return found, last


def _parse(line: bytes) -> tuple[int, str] | None:
    """``(seq, message)`` of a record's first line; None for a continuation line or garbage."""
    if not line or line[:1] == b" ":
        return None
    head, sep, message = line.partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 4 or not fields[1].isdigit():
        return None
    return int(fields[1]), message.decode("utf-8", "replace")
