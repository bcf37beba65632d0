"""Which processes name a path, read straight from ``/proc`` (imports only ``os``).

The hooks' fast path (:mod:`imexctl.quick`) and ``RealHost.processes_with_arg``
ask it first: most of the time no process names the job's config, and then
psutil is never imported (docs/performance.md).
"""

from __future__ import annotations

import os

__all__ = ["mentioned_in_proc"]


def mentioned_in_proc(arg: str) -> bool:
    """Whether any process's ``/proc/<pid>/cmdline`` holds ``arg``: a cheap superset of psutil's matches.

    psutil reads the same file and splits it at NUL bytes (at blanks for a
    process that rewrote its title): an element equal to, or starting with,
    ``arg`` is always a substring of the raw bytes.
    """
    needle = os.fsencode(arg)
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True  # let psutil report it
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False
