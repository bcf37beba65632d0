"""Which processes are IMEX daemons: root's (or our own user's), running the configured ``nvidia-imex``.

A process that merely names a job's file (a pager on ``state.json``, an
``nvidia-imex-ctl`` client, another user's shell) is no daemon: it must not
block a prolog, nor be killed, counted or reported as one (issue 22).  A
daemon is a process

- of uid 0, or of the uid imexctl itself runs as (an unprivileged demo), and
- whose program is ``[commands] nvidia_imex``: its executable
  (``/proc/<pid>/exe``, or ``argv[0]`` when the kernel does not show it, as
  for another user's process to a non-root caller) is that file once
  symlinks are resolved; or, when that file is a ``#!`` script (the
  simulator, a site's wrapper), the process is its interpreter running it
  (``argv[1]``).  A shell script that hands its arguments to another program with
  ``exec ... "$@"`` (the labs' stand-ins set an environment variable and
  ``exec /opt/imexctl/bin/nvidia-imex-sim "$@"``) is followed, a few levels
  deep, so the program it runs counts too.

Standard library only: the prolog's claim runs this on every job.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from imexctl.platform import Record

if TYPE_CHECKING:
    from imexctl.platform.host import ProcInfo

__all__ = ["Programs", "is_daemon", "programs"]

#: interpreters whose scripts are searched for the program they exec
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh"})
#: how many wrapper scripts deep the search goes
_MAX_DEPTH = 4
#: bytes read of each program file: a wrapper is a few lines
_HEAD_BYTES = 8192
#: what the kernel appends to /proc/<pid>/exe when the file was replaced (a package upgrade under a daemon)
_DELETED = " (deleted)"


class Programs(Record):
    """What a daemon's process may run, every path with symlinks resolved.

    ``binaries`` are files the process's executable may be; ``scripts`` maps
    each ``#!`` script to its interpreter, or '' when any interpreter is
    accepted: one found through ``env``, or a shell, which may hand its
    arguments (``"$0"`` too) to any program, as pip's launcher for a long
    interpreter path does (a ``#!/bin/sh`` line, then ``exec`` of python
    with ``"$0" "$@"``).
    """

    binaries: frozenset[str]
    scripts: tuple[tuple[str, str], ...]


def programs(command: str) -> Programs:
    """The programs that run as ``command``: the file itself, and what shell wrappers exec.

    Args:
        command: ``[commands] nvidia_imex``, an absolute path.
    """
    binaries: set[str] = set()
    scripts: dict[str, str] = {}
    todo, depth = [command], 0
    while todo and depth < _MAX_DEPTH:
        depth += 1
        nxt: list[str] = []
        for path in todo:
            real = os.path.realpath(path)
            head = _head(real)
            if not head.startswith(b"#!"):
                binaries.add(real)  # a binary, or missing/unreadable: compared as it is named
                continue
            words = os.fsdecode(head[2:].split(b"\n", 1)[0]).split()
            interp = words[0] if words else ""
            shell = os.path.basename(interp) in _SHELLS
            scripts[real] = "" if shell or os.path.basename(interp) == "env" or not interp else os.path.realpath(interp)
            if shell:
                nxt += [t for t in _exec_targets(os.fsdecode(head)) if os.path.realpath(t) not in scripts]
        todo = nxt
    return Programs(frozenset(binaries), tuple(sorted(scripts.items())))


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError:
        return b""


def _exec_targets(text: str) -> list[str]:
    """The programs a shell wrapper hands its arguments to: the first absolute path on each ``"$@"`` line."""
    out = []
    for line in text.splitlines():
        if '"$@"' not in line or line.lstrip().startswith("#"):
            continue
        # 'exec /usr/bin/env VAR=1 /opt/x "$@"': env only passes its arguments on
        words = [w for w in line.split() if w.startswith("/") and os.path.basename(w) != "env"]
        if words:
            out.append(words[0])
    return out


def is_daemon(proc: ProcInfo, progs: Programs, own_uid: int) -> bool:
    """Whether ``proc`` is an IMEX daemon by owner and program (see the module's docstring)."""
    if proc.uid not in (0, own_uid) or not proc.cmdline:
        return False
    exe = proc.exe.removesuffix(_DELETED)
    files = progs.binaries | {path for path, _ in progs.scripts}
    if (exe or os.path.realpath(proc.cmdline[0])) in files:
        return True
    # an interpreter runs a script as argv[1], or argv[2] after the option of a '#!interp -X' line
    ran = {os.path.realpath(a) for a in proc.cmdline[1:3] if a.startswith("/")}
    return any(
        path in ran and (not exe or not interp or exe == interp or _same_file(exe, interp))
        for path, interp in progs.scripts
    )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
