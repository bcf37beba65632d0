"""``imexctl enroot-hook``: show a Pyxis/enroot container exactly the job's IMEX channel.

enroot runs every executable ``*.sh`` in ``/etc/enroot/hooks.d`` before it
switches to the container's root, as the calling user, inside the
container's user and mount namespaces with all capabilities raised there
(enroot ``src/runtime.sh`` ``runtime::_start`` and ``runtime::_do_hooks``;
``doc/configuration.md``).  ``hooks/enroot/99-imexctl.sh`` runs this module
there.  When the caller is in a Slurm job (``SLURM_JOB_ID``, passed on by
Pyxis) whose domain has a channel on this tray, it

1. checks the host node: a character device with the job's minor, the major
   of ``nvidia-caps-imex-channels`` in ``/proc/devices``, owned by the job's
   user; anything else is a failure;
2. mounts a fresh tmpfs over ``$ENROOT_ROOTFS/dev/nvidia-caps-imex-channels``
   (created if missing), hiding whatever enroot's ``/dev`` bind or
   ``98-nvidia.sh`` put there: other jobs' stale nodes, ``channel0``;
3. bind-mounts the host node onto an empty file ``channel<N>`` in it; a bind
   keeps the host node's owner and mode, so the container gets exactly what
   the host grants the user;
4. appends ``NVIDIA_IMEX_CHANNELS=<N>`` to ``$ENROOT_ENVIRON`` (the last
   line for a name wins: enroot ``bin/common.h`` ``load_environment_fd``;
   Pyxis copies the container's environment into each task:
   pyxis ``pyxis_slurmstepd.c`` ``spank_import_container_env``).

A failure of any step (or a bug) is handled by ``[containers] on_error``:
``open`` (the default) undoes the hook's mounts, warns on standard error and
in ``IMEXCTL_ENROOT_HOOK_WARNING``, and exits 0, so the container starts as
enroot set it up; ``closed`` prints one line and exits 71 (70 for a bug), and
enroot does not start the container (docs/containers.md, "When the hook
fails").  No job, no domain here, another user's job, a domain without a
channel (``channels = none``), or anything at all going wrong while looking
for the job: nothing is changed and the exit code is 0.  Every
path inside the container root is opened with ``O_NOFOLLOW`` and mounted
through ``/proc/self/fd``, so an image cannot redirect a mount with a
symlink; a mount point whose mount propagates (``shared:``) is refused, so
nothing can reach the host's mount table.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Protocol

from imexctl import slurm as var
from imexctl.channels import job as jobchannel
from imexctl.platform.errors import DeviceError, ExitCode, FileError, ImexctlError

if TYPE_CHECKING:
    import argparse

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = [
    "DIR_NAME",
    "ON_ERROR_DEFAULT",
    "WARNING_VARIABLE",
    "HookBug",
    "LibcMounter",
    "MountInfo",
    "Mounter",
    "command",
    "main",
    "mount_id",
    "parse_mountinfo",
    "read_mountinfo",
    "run",
    "show_channel",
]

DIR_NAME = "nvidia-caps-imex-channels"
VARIABLE = "NVIDIA_IMEX_CHANNELS"
# <linux/mount.h>
MS_NOSUID = 0x2
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
#: ``[containers] on_error`` when the config does not set it (docs/containers.md#when-the-hook-fails)
ON_ERROR_DEFAULT = "open"
#: set in the container when the hook failed and let it start (on_error = open)
WARNING_VARIABLE = "IMEXCTL_ENROOT_HOOK_WARNING"
LEFT_AS_IS = f"the container's {DIR_NAME} is left as enroot set it up"
STARTED = (
    f"the container starts with the {DIR_NAME} enroot gave it, not only channel{{minor}} "
    "([containers] on_error = open; see docs/containers.md#when-the-hook-fails)"
)
STOPPED = (
    "the container was not started ([containers] on_error = closed): run 'imexctl doctor' on this tray, "
    "or set on_error = open to let containers start with what enroot gives them "
    "(docs/containers.md#when-the-hook-fails)"
)
_TMPFS_OPTIONS = "mode=0755,size=64k,nr_inodes=64"
#: mount id -> (mount point, optional fields such as ``shared:1``, file system type)
MountInfo = dict[int, tuple[str, tuple[str, ...], str]]


class HookBug(ImexctlError):
    """An unexpected exception while the hook restricted a container (a bug in imexctl)."""

    code = "enroot_hook_bug"
    exit_code = ExitCode.SOFTWARE


class Mounter(Protocol):
    """``mount(2)`` and ``umount2(2)``: the one effect of the hook that tests replace."""

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        """Mount, or raise OSError."""

    def umount(self, target: str, flags: int) -> None:
        """Unmount, or raise OSError."""


class LibcMounter:
    """``mount(2)`` through ctypes: util-linux ``mount`` refuses non-root callers even with capabilities."""

    def __init__(self) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._get_errno = ctypes.get_errno

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        """Call ``mount(2)``; raise OSError with the target on failure."""
        args = [None if v is None else v.encode() for v in (source, target, fstype)]
        rc = self._libc.mount(args[0], args[1], args[2], flags, None if data is None else data.encode())
        if rc != 0:
            err = self._get_errno()
            raise OSError(err, os.strerror(err), target)

    def umount(self, target: str, flags: int) -> None:
        """Call ``umount2(2)``; raise OSError with the target on failure."""
        if self._libc.umount2(target.encode(), flags) != 0:
            err = self._get_errno()
            raise OSError(err, os.strerror(err), target)


def parse_mountinfo(text: str) -> MountInfo:
    """``/proc/self/mountinfo`` as ``mount id -> (mount point, optional fields, fs type)``."""
    mounts = {}
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:] or not fields[0].isdigit():
            continue
        sep = fields.index("-", 6)
        mounts[int(fields[0])] = (fields[4], tuple(fields[6:sep]), fields[sep + 1] if sep + 1 < len(fields) else "")
    return mounts


def mount_id(fd: int) -> int:
    """The mount id of an open descriptor (``mnt_id:`` of ``/proc/self/fdinfo/<fd>``, Linux 3.15+)."""
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "mnt_id":
                return int(value)
    raise FileError(f"/proc/self/fdinfo/{fd} has no mnt_id")


def read_mountinfo() -> MountInfo:
    """This process's ``/proc/self/mountinfo``."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        return parse_mountinfo(f.read())


def run(
    env: Mapping[str, str],
    *,
    config: str | None = None,
    mounter: Mounter | None = None,
    uid: int | None = None,
    uid_map: jobchannel.UidMap = None,
    read_map: bool = True,
    mountinfo: Callable[[], MountInfo] | None = None,
) -> int:
    """The hook; returns 0, or raises :class:`ImexctlError` to stop the container (``main`` prints it as one line).

    Two phases.  Finding the job's channel on this tray never stops a
    container for what it finds: no job, no domain, no channel, another
    user's job, an unusable config, even a bug, all return 0 (with one
    warning line where something looks wrong).  What the prolog left here
    but this user cannot read (a run directory made ``0750`` under a strict
    umask, a ``state.json`` that is not one: ``jobchannel.Unreadable``) is
    no answer: then, and when restricting the container to the channel
    fails, ``[containers] on_error`` decides: ``open`` (the default) undoes
    any partial mount, warns on standard error and in the container's
    environment (``IMEXCTL_ENROOT_HOOK_WARNING``) and returns 0; ``closed``
    raises, and enroot does not start the container.

    Args:
        env: the hook's environment (enroot's, holding the job's).
        config: an explicit imexctl config file; else the usual lookup.
        mounter: ``mount(2)`` and ``umount2(2)`` (default: the real ones).
        uid: the caller's uid (default: ``os.getuid()``).
        uid_map: the caller's uid map (default: ``/proc/self/uid_map`` when ``read_map``).
        read_map: whether to read ``/proc/self/uid_map`` when ``uid_map`` is None.
        mountinfo: reads ``/proc/self/mountinfo`` (default: the real one).

    Raises:
        ImexctlError: the job has a channel here (or what says so cannot be read), restricting
            failed and ``on_error = closed``.
    """
    try:
        found = _find_channel(env, config, uid, uid_map, read_map)
    except _Unknown as exc:
        return _unknown(env, exc)
    except Exception as exc:  # a bug while looking: never a reason to stop a container
        _warn(f"internal error while looking for the job's channel: {type(exc).__name__}: {exc}; {LEFT_AS_IS}")
        return 0
    if found is None:
        return 0
    channel, paths, uid_map = found
    policy, policy_problem = _policy(paths)
    try:
        _restrict(env, channel, paths, uid_map, mounter or LibcMounter(), mountinfo or read_mountinfo)
    except Exception as exc:
        error = exc if isinstance(exc, ImexctlError) else HookBug(f"internal error: {type(exc).__name__}: {exc}")
        if policy == "closed":
            error.args = (f"{error}; {STOPPED.format(minor=channel.minor)}",)  # same class, same exit code
            if error is exc:
                raise
            raise error from exc
        message = f"{error}; {STARTED.format(minor=channel.minor)}{policy_problem}"
        _warn(message)
        _note_in_environ(env.get("ENROOT_ENVIRON", ""), message)
    return 0


class _Unknown(Exception):
    """Whether the job has a channel here cannot be told: the prolog's files cannot be read (``str()`` says why)."""

    def __init__(self, reason: str, paths: jobchannel.NodePaths) -> None:
        super().__init__(reason)
        self.paths = paths


def _unknown(env: Mapping[str, str], exc: _Unknown) -> int:
    """``on_error`` decides: ``closed`` stops the container (exit 71); ``open`` warns and lets it start as it is."""
    policy, policy_problem = _policy(exc.paths)
    error = FileError(f"cannot tell whether this job has an IMEX channel here: {exc}")
    if policy == "closed":
        raise FileError(f"{error}; {STOPPED}")
    message = f"{error}; {LEFT_AS_IS} ([containers] on_error = open){policy_problem}"
    _warn(message)
    _note_in_environ(env.get("ENROOT_ENVIRON", ""), message)
    return 0


def _find_channel(
    env: Mapping[str, str], config: str | None, uid: int | None, uid_map: jobchannel.UidMap, read_map: bool
) -> tuple[jobchannel.JobChannel, jobchannel.NodePaths, jobchannel.UidMap] | None:
    """The caller's job's channel on this tray, or None (nothing to do).

    Raises:
        _Unknown: what the prolog left here cannot be read by this user (``jobchannel.Unreadable``).
    """
    if not var.value(env, var.JOB_ID):
        return None  # enroot outside a Slurm job: nothing of ours to show
    if uid_map is None and read_map:
        uid_map = jobchannel.read_uid_map()
    try:
        paths = jobchannel.read_paths(env, config, uid_map)
    except jobchannel.NoChannel as exc:
        _warn(f"{exc}; {LEFT_AS_IS}")
        return None
    caller = jobchannel.caller_host_uid(uid_map, uid)
    try:
        channel = jobchannel.find_job(paths, jobchannel.candidate_job_ids(env), caller, uid_map, accept_root=True)
    except jobchannel.Unreadable as exc:
        raise _Unknown(str(exc), paths) from None
    except jobchannel.NoChannel:
        return None
    return channel, paths, uid_map


def _policy(paths: jobchannel.NodePaths) -> tuple[str, str]:
    """``[containers] on_error`` and, when its value is not one of ours, a note saying the default applies."""
    if paths.on_error in ("open", "closed"):
        return paths.on_error, ""
    if not paths.on_error:
        return ON_ERROR_DEFAULT, ""
    return ON_ERROR_DEFAULT, f" ({paths.config}: [containers] on_error = {paths.on_error!r} is neither open nor closed)"


def _restrict(
    env: Mapping[str, str],
    channel: jobchannel.JobChannel,
    paths: jobchannel.NodePaths,
    uid_map: jobchannel.UidMap,
    mounter: Mounter,
    mountinfo: Callable[[], MountInfo],
) -> None:
    """Show the container exactly ``channel`` and set ``NVIDIA_IMEX_CHANNELS``; raise what failed."""
    rootfs, environ = env.get("ENROOT_ROOTFS", ""), env.get("ENROOT_ENVIRON", "")
    if not rootfs.startswith("/") or not environ.startswith("/"):
        raise FileError("ENROOT_ROOTFS and ENROOT_ENVIRON must be absolute paths: run this as an enroot hook")
    src_fd, _ = _open_host_node(channel, paths, uid_map)
    try:
        show_channel(rootfs, channel.minor, src_fd, mounter, mountinfo)
    finally:
        os.close(src_fd)
    _append_environ(environ, f"{VARIABLE}={channel.minor}")


def _open_host_node(
    channel: jobchannel.JobChannel, paths: jobchannel.NodePaths, uid_map: jobchannel.UidMap
) -> tuple[int, os.stat_result]:
    from imexctl.channels.devices import find_major

    try:
        with open(paths.proc_devices, encoding="utf-8") as f:
            major = find_major(f.read())
    except OSError as exc:
        raise DeviceError(f"cannot read {paths.proc_devices}: {exc.strerror}") from exc
    if major is None:
        raise DeviceError(f"{paths.proc_devices} lists no {DIR_NAME}: is the NVIDIA driver loaded?")
    try:
        return jobchannel.open_channel(channel, uid_map, major=major)
    except jobchannel.NoChannel as exc:
        raise DeviceError(
            f"job {channel.job_id}: {exc} (imexctl's prolog created it for this job; see 'imexctl status')"
        ) from None


def show_channel(
    rootfs: str, minor: int, src_fd: int, mounter: Mounter, mountinfo: Callable[[], MountInfo] = read_mountinfo
) -> None:
    """Make ``<rootfs>/dev/nvidia-caps-imex-channels`` hold exactly ``channel<minor>``, bound to ``src_fd``.

    Raises:
        FileError: the container root is the host's, a path in it is a symlink,
            the mount point propagates, or a mount fails.
    """
    with _Fd(_open_rootfs(rootfs)) as root, _Fd(_openat_dir(root.fd, "dev", rootfs)) as dev:
        target = f"{rootfs}/dev/{DIR_NAME}"
        created = _make_dir(dev.fd, DIR_NAME, target)
        try:
            _mount_over(dev.fd, target, minor, src_fd, mounter, mountinfo)
        except BaseException:
            if created:  # the container gets back exactly what enroot set up
                try:
                    os.rmdir(DIR_NAME, dir_fd=dev.fd)
                except OSError as exc:
                    _warn(f"cannot remove {target} again: {exc.strerror}")
            raise


def _mount_over(
    dev_fd: int, target: str, minor: int, src_fd: int, mounter: Mounter, mountinfo: Callable[[], MountInfo]
) -> None:
    """Mount the tmpfs on ``<dev>/nvidia-caps-imex-channels`` and fill it; detach it again if filling fails."""
    with _Fd(_openat_dir(dev_fd, DIR_NAME, target)) as under:
        below = _refuse_shared(under.fd, target, mountinfo())
        _mount(mounter, "tmpfs", under.fd, "tmpfs", MS_NOSUID | MS_NOEXEC, _TMPFS_OPTIONS, target)
    with _Fd(_openat_dir(dev_fd, DIR_NAME, target)) as tmpfs:
        try:
            _fill_tmpfs(tmpfs.fd, below, target, minor, src_fd, mounter, mountinfo)
        except BaseException:
            # never leave the container an empty channel directory where enroot showed it the host's
            _detach(mounter, tmpfs.fd, target)
            raise


def _fill_tmpfs(
    fd: int, below: int, target: str, minor: int, src_fd: int, mounter: Mounter, mountinfo: Callable[[], MountInfo]
) -> None:
    """Check the fresh tmpfs at ``fd``, make it private and bind the job's node onto ``channel<minor>`` in it."""
    _check_fresh_tmpfs(fd, below, target, mountinfo())
    _mount(mounter, None, fd, None, MS_PRIVATE, None, target)
    name = f"channel{minor}"
    try:
        placeholder = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd
        )
    except OSError as exc:
        raise FileError(f"{target}/{name}: cannot create the mount point: {exc.strerror}") from exc
    with _Fd(placeholder) as file:
        _bind(mounter, src_fd, file.fd, f"{target}/{name}")
    _check_result(fd, name, os.fstat(src_fd), target)


def _detach(mounter: Mounter, fd: int, path: str) -> None:
    """Lazily unmount the tmpfs at ``fd`` (and the bind in it); a failure is only reported."""
    try:
        mounter.umount(f"/proc/self/fd/{fd}", MNT_DETACH)
    except OSError as exc:
        _warn(f"cannot unmount the tmpfs on {path} again: {exc.strerror}")


def _open_rootfs(rootfs: str) -> int:
    try:
        fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FileError(f"ENROOT_ROOTFS {rootfs}: {exc.strerror}") from exc
    if os.path.samestat(os.fstat(fd), os.stat("/")):
        os.close(fd)
        raise FileError(f"ENROOT_ROOTFS {rootfs} is this process's root: refusing to change the host's /dev")
    return fd


def _make_dir(dir_fd: int, name: str, path: str) -> bool:
    """Create the directory ``name`` (0755) unless something is there; True when this call made it."""
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        return False
    except OSError as exc:
        raise FileError(f"{path}: cannot create: {exc.strerror}") from exc
    return True


def _openat_dir(dir_fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FileError(f"{path} is a symbolic link or not a directory (not followed)") from exc
        raise FileError(f"{path}: {exc.strerror}") from exc


def _refuse_shared(fd: int, path: str, mounts: MountInfo) -> int:
    """The id of ``fd``'s mount, which must not be shared: a mount on it would propagate to its peers (the host's)."""
    below = mount_id(fd)
    info = mounts.get(below)
    if info is None:
        raise FileError(f"{path}: its mount is not in /proc/self/mountinfo")
    if any(tag.startswith("shared:") for tag in info[1]):
        raise FileError(
            f"refusing to mount on {path}: its mount {info[0]} is shared and would propagate (not in enroot?)"
        )
    return below


def _check_fresh_tmpfs(fd: int, below: int, path: str, mounts: MountInfo) -> None:
    now = mount_id(fd)
    info = mounts.get(now)
    if now == below or info is None or info[2] != "tmpfs" or os.listdir(fd):
        raise FileError(f"{path}: the new tmpfs is not where it was mounted")


def _mount(
    mounter: Mounter, source: str | None, fd: int, fstype: str | None, flags: int, data: str | None, path: str
) -> None:
    try:
        mounter.mount(source, f"/proc/self/fd/{fd}", fstype, flags, data)
    except OSError as exc:
        raise FileError(f"cannot mount {fstype or 'propagation'} on {path}: {exc.strerror}") from exc


def _bind(mounter: Mounter, src_fd: int, dst_fd: int, path: str) -> None:
    try:
        mounter.mount(f"/proc/self/fd/{src_fd}", f"/proc/self/fd/{dst_fd}", None, MS_BIND, None)
    except OSError as exc:
        raise FileError(f"cannot bind the job's channel onto {path}: {exc.strerror}") from exc


def _check_result(dir_fd: int, name: str, want: os.stat_result, path: str) -> None:
    """What the container will see: exactly one entry, the host's node."""
    entries = sorted(os.listdir(dir_fd))
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if entries != [name] or not stat.S_ISCHR(st.st_mode) or st.st_rdev != want.st_rdev or st.st_ino != want.st_ino:
        raise FileError(f"{path} does not hold exactly the job's channel after the bind: {entries}")


def _note_in_environ(path: str, message: str) -> None:
    """Put the warning into the container's environment too: Pyxis shows a hook's stderr only when enroot fails."""
    if not path.startswith("/"):
        return
    try:
        _append_environ(path, f"{WARNING_VARIABLE}={' '.join(message.split())}")
    except FileError as exc:
        _warn(f"{exc}: the warning above is not in the container's environment")


def _append_environ(path: str, line: str) -> None:
    # a leading newline: the file may not end with one; enroot drops empty lines
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise FileError(f"ENROOT_ENVIRON {path}: {exc.strerror}") from exc
    with _Fd(fd):
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileError(f"ENROOT_ENVIRON {path} is not a regular file")
        try:
            os.write(fd, f"\n{line}\n".encode())
        except OSError as exc:
            raise FileError(f"ENROOT_ENVIRON {path}: cannot append: {exc.strerror}") from exc


class _Fd:
    """Close a descriptor when the block ends."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> _Fd:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _warn(message: str) -> None:
    print(f"imexctl enroot hook: {message}", file=sys.stderr)


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl enroot-hook``: :func:`main` over the command's environment and ``--config``."""
    return main(env, config=args.config)


def main(env: Mapping[str, str] | None = None, *, config: str | None = None, mounter: Mounter | None = None) -> int:
    """Run the hook; print a stopping error as one line on standard error and return its exit code (70 or 71).

    ``run`` stops a container only under ``[containers] on_error = closed``,
    for a job with a channel here; everything else returns 0.
    """
    try:
        return run(os.environ if env is None else env, config=config, mounter=mounter)
    except ImexctlError as exc:
        _warn(str(exc))
        return int(exc.exit_code)


if __name__ == "__main__":
    sys.exit(main())
