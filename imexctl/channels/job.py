"""The job's IMEX channel as the job's own user finds it: for the TaskProlog and the enroot hook.

Both run as the job's user, the TaskProlog once per task, so this module
imports only ``os`` and ``stat`` and imexctl's light :mod:`imexctl.config.schema`
and :mod:`imexctl.slurm`'s table of Slurm's variables (:mod:`imexctl.config.jobstate` and ``json`` to read
a job's state): no structlog, no settings machinery, no dataclasses.
It reads what the prolog left for every user to read, and nothing else:

- the imexctl config file, found and read as the prolog finds and reads it
  (:mod:`imexctl.config.schema`), for three ``[paths]`` keys only (``root``,
  ``run_dir``, ``proc_devices``) and ``[containers] on_error`` (the enroot
  hook's policy); invalid keys elsewhere are the prolog's business;
- ``<run_dir>/jobs/<job id>/state.json`` (root's, mode 0644, in 0755
  directories), every component opened with ``O_NOFOLLOW``;
- the channel node itself (``O_PATH``, never followed through a symlink);
- ``/proc/self/uid_map``, to compare uids across a user namespace (enroot's
  hooks and Pyxis tasks run in one).

Nothing here grants anything: the job's user could print any ``export`` line
from a ``--task-prolog`` of their own, and a bind mount keeps the host node's
owner and mode.  The checks make the answer right, not safe.
"""

from __future__ import annotations

import errno
import os
import stat

from imexctl import slurm as var
from imexctl.config import schema

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

    #: ``(inside, outside, count)`` ranges of ``/proc/self/uid_map``; None: unreadable, identity assumed
    UidMap = Optional[tuple[tuple[int, int, int], ...]]

__all__ = [
    "JobChannel",
    "NoChannel",
    "NodePaths",
    "Unreadable",
    "caller_host_uid",
    "candidate_job_ids",
    "find_job",
    "open_channel",
    "read_note",
    "read_paths",
    "read_uid_map",
    "to_host_uid",
]

#: the ``[paths]`` keys read here, with their defaults and checks from ``schema.SCHEMA``
_PATH_KEYS = ("root", "run_dir", "proc_devices")
_MAX_CONFIG_BYTES = 1 << 20
_MAX_STATE_BYTES = 16 << 20
_MAX_CANDIDATES = 64


class NoChannel(Exception):
    """The job has no usable channel on this tray; ``str()`` says why, in one line."""


class Unreadable(NoChannel):
    """What the prolog left here may not be read by this user: whether the job has a channel is unknown.

    Not "no channel" (issue 33: under slurmd's umask 027 the run directories
    came out 0750, the job's user could not open them, and the enroot hook
    took that for a job without a domain and left the container unrestricted
    even with ``on_error = closed``): the run directory, ``jobs/``, the job's
    directory, its ``state.json`` or the channel's directory exists but
    opening it is refused (``EACCES``, ``EPERM``).  What can be read and is
    wrong (a symlink, a directory others may write, a ``state.json`` that is
    not one) stays :class:`NoChannel`, as before.
    """


class NodePaths:
    """The ``[paths]`` this module needs, already under ``[paths] root``."""

    __slots__ = ("config", "on_error", "proc_devices", "run_dir")

    def __init__(self, run_dir: str, proc_devices: str, config: str | None, on_error: str = "") -> None:
        self.run_dir = run_dir
        self.proc_devices = proc_devices
        self.config = config
        #: ``[containers] on_error`` as written ('' when not set): the enroot hook judges it
        self.on_error = on_error


class JobChannel:
    """The job's channel as ``state.json`` records it: job id, owner (host uid), minor, node path."""

    __slots__ = ("job_id", "minor", "path", "uid")

    def __init__(self, job_id: int, uid: int, minor: int, path: str) -> None:
        self.job_id = job_id
        self.uid = uid
        self.minor = minor
        self.path = path

    def __repr__(self) -> str:
        return f"JobChannel(job_id={self.job_id}, uid={self.uid}, minor={self.minor}, path={self.path!r})"


# ---------------------------------------------------------------- configuration


def read_paths(env: Mapping[str, str], explicit: str | None = None, uid_map: UidMap = None) -> NodePaths:
    """``run_dir`` and ``proc_devices`` for this tray, from the config file or the defaults.

    The file is the one the prolog reads (:func:`imexctl.config.schema.find_config`),
    read in its grammar (:func:`imexctl.config.schema.parse_ini_subset`); the keys
    are checked and placed under ``root`` as the prolog does (``SCHEMA``,
    :func:`imexctl.config.schema.node_paths`).

    Raises:
        NoChannel: the config file is missing (when it must exist), unsafe,
            unreadable or not in the grammar, or a path in ``[paths]`` is not absolute.
    """
    path, required = schema.find_config(explicit, env, slurm_conf=var.value(env, var.CONF))
    sections = _read_sections(path, required, uid_map)
    given = (sections or {}).get("paths", {})
    try:
        values = {key: schema.parse_key(path, "paths", key, given.get(key)) for key in _PATH_KEYS}
    except schema.SchemaError as exc:
        raise NoChannel(str(exc)) from None
    node = _node_name(env) if "%n" in values["root"] else ""
    found = schema.node_paths(values, node)
    on_error = (sections or {}).get("containers", {}).get("on_error", "").strip()
    config = path if sections is not None else None
    return NodePaths(found.run_dir, found.proc_devices, config, on_error)


def _node_name(env: Mapping[str, str]) -> str:
    from imexctl.slurm.job import node_name

    try:
        return node_name(env, or_host=True)
    except Exception as exc:  # EnvironmentError_, imported only when raised (start-up cost)
        raise NoChannel(f"{exc}: it cannot stand for %n in [paths] root") from None


def _read_sections(path: str, required: bool, uid_map: UidMap) -> dict[str, dict[str, str]] | None:
    """The sections of the config file, read as the hooks read it; None when the optional default is absent."""
    try:
        text = schema.read_trusted(
            path, required=required, trusted=lambda st: _trusted(st, uid_map), max_bytes=_MAX_CONFIG_BYTES
        )
        return None if text is None else schema.parse_ini_subset(text, path)
    except schema.SchemaError as exc:
        raise NoChannel(str(exc)) from None


# ---------------------------------------------------------------- uids across user namespaces


def read_uid_map(path: str = "/proc/self/uid_map") -> UidMap:
    """This process's uid map (``inside outside count`` lines), or None when unreadable (identity assumed)."""
    try:
        with open(path, "rb") as f:
            text = f.read(65536).decode()
    except (OSError, UnicodeDecodeError):
        return None
    ranges = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(x.isdigit() for x in fields):
            ranges.append((int(fields[0]), int(fields[1]), int(fields[2])))
    return tuple(ranges)


def to_host_uid(uid: int, uid_map: UidMap) -> int | None:
    """The host uid of ``uid`` as this namespace sees it; None when it is not mapped (the overflow uid)."""
    if uid_map is None:
        return uid
    for inside, outside, count in uid_map:
        if inside <= uid < inside + count:
            return outside + (uid - inside)
    return None


def caller_host_uid(uid_map: UidMap, uid: int | None = None) -> int | None:
    """The host uid of this process (``getuid()``, or ``uid``, mapped out of its user namespace)."""
    return to_host_uid(os.getuid() if uid is None else uid, uid_map)


def _trusted(st: os.stat_result, uid_map: UidMap) -> bool:
    """Not writable by group or others, and owned by root, by the caller, or by a uid this namespace cannot see.

    Inside enroot's user namespace root's files show as the overflow uid;
    their mode still says that only their owner may write them.
    """
    owner = to_host_uid(st.st_uid, uid_map)
    return not st.st_mode & 0o022 and owner in (0, caller_host_uid(uid_map), None)


# ---------------------------------------------------------------- the job and its state


def candidate_job_ids(env: Mapping[str, str]) -> tuple[int, ...]:
    """Job ids under which the job's domain may be recorded, in the order they are tried.

    ``SLURM_JOB_ID`` first.  In a het job every task sees the het job's leader
    id there (slurm ``src/slurmd/slurmstepd/task.c`` ``exec_task``), which is
    the key of a joint domain (``[slurm] het_jobs = joint``); a domain per
    component is keyed by the component's id, which tasks see only as
    ``SLURM_JOB_ID_HET_GROUP_<n>`` (slurm ``src/common/env.c``
    ``env_array_overwrite_het_fmt``) or, in the tasks of a het job that srun
    itself allocated (``srun ... : ...``), as ``SLURM_JOB_ID_PACK_GROUP_<n>``
    (slurm ``src/srun/srun_job.c`` ``_build_key``; seen under 22.05 and 24.11
    in the lab).  Malformed values are skipped.  The variables are
    :mod:`imexctl.slurm`'s.
    """
    ids: list[int] = []
    for value in var.task_job_ids(env):
        if value.isascii() and value.isdigit() and 1 <= int(value) <= var.MAX_JOB_ID and int(value) not in ids:
            ids.append(int(value))
    return tuple(ids[:_MAX_CANDIDATES])


def find_job(
    paths: NodePaths,
    job_ids: Sequence[int],
    caller: int | None,
    uid_map: UidMap,
    *,
    accept_root: bool = False,
) -> JobChannel:
    """The first of ``job_ids`` with a domain on this tray that belongs to ``caller``, and has a channel.

    Args:
        paths: where the prolog keeps its state.
        job_ids: candidates, from :func:`candidate_job_ids`.
        caller: the caller's host uid.
        uid_map: this process's uid map, for the ownership checks.
        accept_root: also accept a caller with host uid 0 (the enroot hook under
            ``ENROOT_ALLOW_SUPERUSER``).

    Raises:
        NoChannel: no such job here, not the caller's, or no channel (``channels = none``).
    """
    if not job_ids:
        raise NoChannel("no job id in the environment (SLURM_JOB_ID)")
    if caller is None:
        raise NoChannel("this process's uid is not mapped to a host uid")
    unreadable = False
    try:
        run_dir = _Dir.open_path(paths.run_dir, uid_map)
        with run_dir, _sub_or_none(run_dir, schema.JOBS_DIR) as jobs:
            if jobs is None:
                raise NoChannel(f"no imexctl domain on this node ({paths.run_dir}/{schema.JOBS_DIR} is absent)")
            why = []
            for job_id in job_ids:
                try:
                    state = _read_job(jobs, job_id)
                except NoChannel as exc:
                    why.append(str(exc))
                    unreadable = unreadable or isinstance(exc, Unreadable)
                    continue
                if state.uid == caller or (accept_root and caller == 0):
                    return state
                why.append(f"job {job_id} belongs to uid {state.uid}, not to uid {caller}")
    except FileNotFoundError:
        raise NoChannel(f"no imexctl run directory {paths.run_dir} on this node") from None
    except OSError as exc:
        raise _error(exc)(f"{exc.filename or paths.run_dir}: {_reason(exc)}") from None
    raise (Unreadable if unreadable else NoChannel)("; ".join(why))


def read_note(paths: NodePaths, job_ids: Sequence[int], uid_map: UidMap) -> str:
    """The first note the prolog left for one of ``job_ids`` (:mod:`imexctl.channels.notes`), one line; '' when none.

    Read like the job's state: from ``/`` without following a symlink, from
    directories and a file that only root may write.
    """
    try:
        with _Dir.open_path(paths.run_dir, uid_map) as run_dir, _sub_or_none(run_dir, "notes") as notes:
            if notes is None:
                return ""
            for job_id in job_ids:
                try:
                    text = notes.read(str(job_id))
                except FileNotFoundError:
                    continue
                return text[:1000].decode("utf-8", "replace").split("\n", 1)[0].strip()
    except (OSError, NoChannel):
        return ""
    return ""


def _read_job(jobs: _Dir, job_id: int) -> JobChannel:
    try:
        with jobs.sub(str(job_id)) as job_dir:
            return _read_state(job_dir, job_id)
    except FileNotFoundError:
        raise NoChannel(f"no imexctl domain for job {job_id} on this node") from None
    except OSError as exc:
        raise _error(exc)(f"job {job_id}: {jobs.path}/{job_id}: {_reason(exc)}") from None


def _read_state(job_dir: _Dir, job_id: int) -> JobChannel:
    try:
        data = job_dir.read(schema.JOB_STATE)
    except FileNotFoundError:
        raise NoChannel(f"job {job_id}: no state.json (a prolog still running, or failed)") from None
    except OSError as exc:
        raise _error(exc)(f"job {job_id}: state.json: {_reason(exc)}") from None
    from imexctl.config import jobstate  # here, not at the top: the hooks' fast path imports this module

    try:
        uid, minor, path = jobstate.channel_of(data)  # the one schema of state.json
    except jobstate.StateInvalid as exc:
        raise NoChannel(f"job {job_id}: {exc}") from None
    if minor is None:
        raise NoChannel(f"job {job_id} has no channel from imexctl here ([policy] channels = none)")
    if not path.startswith("/"):
        raise NoChannel(f"job {job_id}: channel_path {path!r} is not absolute")
    return JobChannel(job_id, uid, minor, path)


# ---------------------------------------------------------------- the channel node


def open_channel(channel: JobChannel, uid_map: UidMap, *, major: int | None = None) -> tuple[int, os.stat_result]:
    """Open the job's channel node with ``O_PATH`` (no symlink anywhere) and check it.

    Returns:
        The descriptor (the caller closes it) and the node's status.

    Raises:
        NoChannel: missing, a symlink, not a character device, another minor
            (or major), or not owned by the job's user; :class:`Unreadable`
            when the way to it may not be taken (a directory this user may not search).
    """
    directory, _, name = channel.path.rpartition("/")
    try:
        with _Dir.open_path(directory or "/", uid_map, trust=False) as d:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d.fd)
    except FileNotFoundError:
        raise NoChannel(f"channel {channel.path} is missing") from None
    except OSError as exc:
        raise _error(exc)(f"channel {channel.path}: {_reason(exc)}") from None
    st = os.fstat(fd)
    problem = _node_problem(st, channel, uid_map, major)
    if problem:
        os.close(fd)
        raise NoChannel(f"channel {channel.path} {problem}")
    return fd, st


def _node_problem(st: os.stat_result, channel: JobChannel, uid_map: UidMap, major: int | None) -> str:
    if not stat.S_ISCHR(st.st_mode):
        return "is not a character device" if not stat.S_ISLNK(st.st_mode) else "is a symbolic link"
    if os.minor(st.st_rdev) != channel.minor:
        return f"has minor {os.minor(st.st_rdev)}, not {channel.minor}"
    if major is not None and os.major(st.st_rdev) != major:
        return f"has major {os.major(st.st_rdev)}, not {major} (nvidia-caps-imex-channels in /proc/devices)"
    owner = to_host_uid(st.st_uid, uid_map)
    if owner != channel.uid:
        return f"is owned by uid {owner if owner is not None else '(unmapped)'}, not by the job's uid {channel.uid}"
    return ""


def _error(exc: OSError) -> type[NoChannel]:
    """:class:`Unreadable` for an open that permissions refused, else :class:`NoChannel`."""
    return Unreadable if exc.errno in (errno.EACCES, errno.EPERM) else NoChannel


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symbolic link or a non-directory on the way (not followed)"
    return exc.strerror or str(exc)


# ---------------------------------------------------------------- directories, never through a symlink


class _Dir:
    """An open directory, reached from ``/`` one component at a time with ``O_NOFOLLOW``."""

    __slots__ = ("fd", "path", "uid_map")

    def __init__(self, fd: int, path: str, uid_map: UidMap) -> None:
        self.fd, self.path, self.uid_map = fd, path, uid_map

    @classmethod
    def open_path(cls, path: str, uid_map: UidMap, *, trust: bool = True) -> _Dir:
        """Open ``path``; with ``trust``, refuse it if anybody but its owner (root, or the caller) may write it."""
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in (p for p in path.split("/") if p):
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        d = cls(fd, path, uid_map)
        if trust:
            d.check()
        return d

    def sub(self, name: str) -> _Dir:
        """The subdirectory ``name`` (never a symlink), checked like this one."""
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        d = _Dir(fd, f"{self.path}/{name}", self.uid_map)
        d.check()
        return d

    def check(self) -> None:
        """Refuse a directory that others than its owner may write."""
        if not _trusted(os.fstat(self.fd), self.uid_map):
            os.close(self.fd)
            raise NoChannel(f"{self.path} may be written by others than root")

    def read(self, name: str) -> bytes:
        """The regular file ``name`` (never a symlink, never a FIFO), writable only by its owner."""
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _trusted(st, self.uid_map):
                raise NoChannel(f"{self.path}/{name}: not a regular file writable only by root")
            return f.read(_MAX_STATE_BYTES)

    def __enter__(self) -> _Dir:  # noqa: PYI034 (typing.Self would cost an import at every task start)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class _NoDir:
    """``with`` target for a directory that does not exist."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _sub_or_none(parent: _Dir, name: str) -> _Dir | _NoDir:
    try:
        return parent.sub(name)
    except FileNotFoundError:
        return _NoDir()
