"""Which processes name a path, read straight from ``/proc`` (imports only ``os``).

The hooks' fast path (:mod:`imexctl.hooks.quick`) and ``RealHost.processes_with_arg``
read the process table here, without psutil (its import alone costs a hook
about 13 ms; docs/performance.md).
"""

from __future__ import annotations

import os

__all__ = ["cmdlines", "mentioned_in_proc"]


def cmdlines() -> list[tuple[int, bytes]]:
    """Every process's pid and raw ``/proc/<pid>/cmdline``; processes gone meanwhile are left out.

    Raises:
        OSError: ``/proc`` cannot be listed.
    """
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append((pid, f.read()))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return out


def mentioned_in_proc(arg: str) -> bool:
    """Whether any process's ``/proc/<pid>/cmdline`` holds ``arg``: a cheap superset of the argv matches.

    An argv element equal to, or starting with, ``arg`` is always a substring
    of the raw bytes.  True when ``/proc`` cannot be listed (the caller then
    looks closer, and reports it).
    """
    needle = os.fsencode(arg)
    try:
        return any(needle in raw for _, raw in cmdlines())
    except OSError:
        return True
