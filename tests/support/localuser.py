"""A local user of the tray as an attacker: processes and files made by an unprivileged user (issue 33).

The lab machine has the user ``imexlab`` (``.ci/setup test``); the tests that
use it run as root, start the attacker's processes with that user's uid and
gid (no other group), and end every one of them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

__all__ = [
    "USER",
    "as_user",
    "fat_processes",
    "needs_local_user",
    "read_counted",
    "shared_dir",
    "spawn_as_user",
    "user_ids",
]

USER = "imexlab"
#: one argv element at most (the kernel's MAX_ARG_STRLEN is 32 pages, with its NUL)
_ARG = 131000
#: prctl(2) PR_SET_DUMPABLE
_PR_SET_DUMPABLE = 4


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory of root's (mode 0755) that the local user can reach, unlike pytest's ``tmp_path``; removed after."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="imxu", dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def user_ids() -> tuple[int, int] | None:
    """The local user's uid and gid, or None when the machine has no such user."""
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


needs_local_user = pytest.mark.skipif(
    os.geteuid() != 0 or user_ids() is None,
    reason=f"needs root, to run the attacker as the unprivileged user {USER} (made by '.ci/setup test')",
)


def spawn_as_user(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kw: object
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the local user (its uid and gid, no other group), in ``/``, with a bare environment."""
    ids = user_ids()
    assert ids is not None, USER
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        list(argv),
        user=ids[0],
        group=ids[1],
        extra_groups=[],
        cwd="/",
        env=dict(env or {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}),
        stdin=subprocess.DEVNULL,
        **kw,
    )


def as_user(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion as the local user (``env`` added to a bare environment); its output."""
    full = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
    p = spawn_as_user(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(list(argv), p.returncode, out.decode(errors="replace"), "")


@contextlib.contextmanager
def fat_processes(count: int, size: int, *, dumpable: bool = True, marker: str = "") -> Iterator[list[int]]:
    """``count`` processes of the local user, each with a command line of about ``size`` bytes; their pids.

    A not ``dumpable`` process (``prctl(PR_SET_DUMPABLE, 0)``, as set-uid
    programs and file capabilities make it) shows as root's in ``/proc``.
    Each process starts once (a Python that sleeps), with its whole command
    line in its own memory, as an attacker's forks would be.
    """
    code = "import time\n"
    if not dumpable:
        code += f"import ctypes\nctypes.CDLL(None).prctl({_PR_SET_DUMPABLE}, 0, 0, 0, 0)\n"
    code += "time.sleep(600)\n"
    args = ["x" * _ARG] * max(1, size // _ARG)
    procs = [spawn_as_user([sys.executable, "-I", "-c", code, marker, *args]) for _ in range(count)]
    try:
        for p in procs:
            _wait_shown(p.pid, size, dumpable)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _wait_shown(pid: int, size: int, dumpable: bool) -> None:
    """Until ``/proc`` shows the process's command line (after its exec), and it is no longer dumpable if asked."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            shown = os.stat(f"/proc/{pid}/cmdline").st_uid == 0 if not dumpable else True
            if shown and len(Path(f"/proc/{pid}/cmdline").read_bytes()) >= size // 2:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed its command line")


def read_counted(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, int, str]:
    """Run ``argv`` to its end: its exit code, the bytes it read (``rchar``) and its output.

    ``rchar`` of ``/proc/<pid>/io`` counts every byte that ``read`` returned
    to the process; it is read while the exited process is still a zombie
    (``waitid`` with ``WNOWAIT``), then the process is reaped.
    """
    p = subprocess.Popen(
        list(argv), env=dict(env), cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert p.stdout is not None
    with p.stdout:
        out = p.stdout.read()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    io = dict(line.split(": ") for line in Path(f"/proc/{p.pid}/io").read_text().splitlines())
    p.wait()
    return p.returncode, int(io["rchar"]), out.decode(errors="replace")
