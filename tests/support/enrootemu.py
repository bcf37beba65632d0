"""Run an enroot hook the way enroot runs it, without enroot (Debian has no enroot or Pyxis package).

What enroot does before its hooks, and what this emulation reproduces
(enroot ``src/runtime.sh`` ``runtime::start``/``runtime::_start``,
``conf/mounts/10-system.fstab``, ``conf/hooks/10-devices.sh``,
``conf/hooks/98-nvidia.sh``):

- a new mount namespace, and for a non-root caller a new user namespace
  whose only uid is the caller's (or 0 for ``ENROOT_REMAP_ROOT``), with all
  capabilities raised there: here ``unshare --user --map-current-user
  --keep-caps --mount`` (``--map-root-user`` for remap-root) as the
  unprivileged user, or ``unshare --mount`` as root;
- the container root bound onto itself ``nosuid,nodev``, slave;
- ``/dev``: the host's ``/dev`` bound recursively (the default; ``dev=host``),
  or a fresh tmpfs (``ENROOT_RESTRICT_DEV``; ``dev=restricted``), or that
  tmpfs plus a read-only bind of the host's channel directory (enroot
  4.x ``98-nvidia.sh`` with the compute capability; ``dev=nvidia``).  The
  "host ``/dev``" is a directory of the test's own node tree;
- the environment file; then the hook runs with ``ENROOT_ROOTFS``,
  ``ENROOT_ENVIRON``, ``ENROOT_MOUNTS``, ``ENROOT_PID`` and the job's
  variables, in the host's file system view.

Afterwards a child process ``chroot``s into the container root, as
``enroot-switchroot`` would, and reports what ``/dev/nvidia-caps-imex-channels``
holds there.  Everything happens in namespaces that vanish with the process:
the host's mount table is never touched.

``python -m tests.support.enrootemu SPEC.json`` is the part that runs inside
the namespaces and prints one JSON object; :func:`emulate` builds the
``unshare`` command line around it.  It needs no Slurm, so the lab can run the
same emulation as a job step (see docs/containers.md, "Lab tests").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
CHANNELS = "nvidia-caps-imex-channels"
UNSHARE = "/usr/bin/unshare"
RUNUSER = "/usr/sbin/runuser"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE, MS_SHARED = 0x20, 0x1000, 0x4000, 1 << 19, 1 << 20
_STATVFS_TO_MS = (
    (os.ST_RDONLY, MS_RDONLY),
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, 0x400),
    (os.ST_NODIRATIME, 0x800),
    (os.ST_RELATIME, 1 << 21),
)


def emulate(
    *,
    rootfs: Path,
    host_dev: Path,
    workdir: Path,
    env: dict[str, str],
    dev: str = "host",
    user: str | None = None,
    remap_root: bool = False,
    hook: list[str] | None = None,
    shared: bool = False,
    timeout: float = 60,
) -> dict[str, Any]:
    """Start a container like enroot would, run ``hook`` (default: imexctl's) and report what it sees.

    Args:
        rootfs: the container root (a directory with ``dev/``), writable by ``user``.
        host_dev: the directory that stands for the host's ``/dev``.
        workdir: a directory ``user`` may write (the environment file goes there).
        env: the job's variables for the hook (``SLURM_JOB_ID``, ``IMEXCTL_CONFIG``, ...).
        dev: ``host``, ``restricted`` or ``nvidia`` (see the module docstring).
        user: run as this unprivileged user in a new user namespace (needs root, for runuser).
        remap_root: map ``user`` to uid 0 in the namespace (``ENROOT_REMAP_ROOT``).
        hook: the hook's argv (default ``python -m imexctl.channels.enroot`` from this checkout).
        shared: make the container's ``/dev`` a shared mount (enroot never does; the hook must refuse).

    Returns:
        ``{"rc", "stderr", "view", "environ"}``: the hook's exit code and standard
        error, the listing of ``/dev/nvidia-caps-imex-channels`` seen from inside
        the container root (None if absent; each node with what ``open(2)`` said
        to the container's user), and the environment file after the hook.
    """
    spec_file = write_spec(
        rootfs=rootfs, host_dev=host_dev, workdir=workdir, env=env, dev=dev, hook=hook, shared=shared
    )
    if user is None:
        argv = [UNSHARE, "--mount", "--propagation", "private", *inner_argv(spec_file)]
    else:
        argv = [RUNUSER, "-u", user, "--", *user_namespace_argv(spec_file, remap_root=remap_root)]
    run_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=timeout, check=False, cwd="/")
    if done.returncode != 0:
        raise RuntimeError(f"emulation failed ({done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def write_spec(
    *,
    rootfs: Path,
    host_dev: Path,
    workdir: Path,
    env: dict[str, str],
    dev: str = "host",
    hook: list[str] | None = None,
    shared: bool = False,
) -> Path:
    """Write ``<workdir>/spec.json`` for :func:`inside` (arguments as for :func:`emulate`)."""
    spec = {
        "rootfs": str(rootfs),
        "host_dev": str(host_dev),
        "workdir": str(workdir),
        "dev": dev,
        "env": env,
        "hook": hook or [sys.executable, "-m", "imexctl.channels.enroot"],
        "shared": shared,
    }
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps(spec))
    spec_file.chmod(0o644)
    return spec_file


def inner_argv(spec_file: Path) -> list[str]:
    """The command that runs inside the namespaces (needs ``PYTHONPATH`` = the checkout)."""
    return [sys.executable, "-m", "tests.support.enrootemu", str(spec_file)]


def user_namespace_argv(spec_file: Path, *, remap_root: bool = False) -> list[str]:
    """The emulation as the calling (unprivileged) user, as enroot starts containers for users.

    A Slurm job step of the lab can run exactly this line as the job's user.
    """
    mapping = "--map-root-user" if remap_root else "--map-current-user"
    return [UNSHARE, "--user", mapping, "--keep-caps", "--mount", *inner_argv(spec_file)]


# ---------------------------------------------------------------- inside the namespaces


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    from imexctl.channels.enroot import LibcMounter

    LibcMounter().mount(source, target, fstype, flags, data)


def _bind(source: str, target: str, extra: int, *, recursive: bool = False) -> None:
    """``mount --bind`` then a remount adding ``extra`` and keeping the source's locked flags (as enroot-mount)."""
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    keep = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | extra
    for st_flag, ms_flag in _STATVFS_TO_MS:
        if keep & st_flag:
            flags |= ms_flag
    _mount(None, target, None, flags)


def _prepare(spec: dict[str, Any]) -> tuple[str, str]:
    rootfs, host_dev = spec["rootfs"], spec["host_dev"]
    _bind(rootfs, rootfs, MS_NOSUID | MS_NODEV)
    _mount(None, rootfs, None, MS_SLAVE | MS_REC)
    dev = f"{rootfs}/dev"
    if spec["dev"] == "host":
        _mount(host_dev, dev, None, MS_BIND | MS_REC)
        _mount(None, dev, None, MS_SLAVE | MS_REC)
    else:
        _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755")
        if spec["dev"] == "nvidia":
            os.mkdir(f"{dev}/{CHANNELS}", 0o755)
            _bind(f"{host_dev}/{CHANNELS}", f"{dev}/{CHANNELS}", MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    if spec.get("shared"):
        _mount(None, dev, None, MS_SHARED | MS_REC)
    environ = f"{spec['workdir']}/environ"
    Path(environ).write_text("PATH=/usr/local/bin:/usr/bin:/bin\nNVIDIA_IMEX_CHANNELS=0")  # no final newline
    mounts = f"{spec['workdir']}/mounts"
    Path(mounts).write_text("")
    return environ, mounts


def _uid_map() -> list[list[int]]:
    with open("/proc/self/uid_map", encoding="ascii") as f:
        return [[int(x) for x in line.split()] for line in f if line.strip()]


def _host_uid(uid: int, ranges: list[list[int]]) -> int | None:
    for inside, outside, count in ranges:
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None


def _view_from_inside(rootfs: str) -> list[dict[str, Any]] | None:
    """What a process whose root is the container's sees in /dev/nvidia-caps-imex-channels."""
    ranges = _uid_map()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "container": chroot, look, report through the pipe
        try:
            os.close(read_fd)
            os.chroot(rootfs)
            os.chdir("/")
            path = f"/dev/{CHANNELS}"
            view = None if not os.path.isdir(path) else [_entry(path, n, ranges) for n in sorted(os.listdir(path))]
            os.write(write_fd, json.dumps(view).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else None  # type: ignore[no-any-return]


def _entry(path: str, name: str, ranges: list[list[int]]) -> dict[str, Any]:
    import stat

    st = os.lstat(f"{path}/{name}")
    return {
        "name": name,
        "char": stat.S_ISCHR(st.st_mode),
        "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev),
        "host_uid": _host_uid(st.st_uid, ranges),
        "mode": stat.S_IMODE(st.st_mode),
        "open": _try_open(f"{path}/{name}") if stat.S_ISCHR(st.st_mode) else None,
    }


def _try_open(path: str) -> str:
    """What ``open(2)`` for reading and writing says: ``granted`` past the permission check, else the errno's name.

    The test nodes have a major without a driver, so a permitted open ends in ENXIO or ENODEV
    (as ``cat`` showed in the container under a real enroot 4.1.2, docs/containers.md).
    """
    import errno

    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENODEV):
            return "granted"
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "granted"


def inside(spec_file: str) -> int:
    """Set the container up, run the hook, report; prints one JSON object."""
    spec = json.loads(Path(spec_file).read_text())
    environ, mounts = _prepare(spec)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "ENROOT_ROOTFS": spec["rootfs"],
        "ENROOT_ENVIRON": environ,
        "ENROOT_MOUNTS": mounts,
        "ENROOT_PID": str(os.getpid()),
        **spec["env"],
    }
    done = subprocess.run(spec["hook"], env=env, capture_output=True, text=True, timeout=60, check=False)
    report = {
        "rc": done.returncode,
        "stderr": done.stderr,
        "view": _view_from_inside(spec["rootfs"]),
        "environ": Path(environ).read_text(),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(inside(sys.argv[1]))
