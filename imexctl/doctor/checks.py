"""The checks of imexctl itself for ``imexctl doctor``: its config, its directories and logs, stale jobs and channels.

The other groups: :mod:`imexctl.doctor.slurm` (slurm.conf),
:mod:`imexctl.doctor.resolve` (node addresses), :mod:`imexctl.doctor.host`
(IMEX, ports, NVML) and :mod:`imexctl.doctor.containers`;
:mod:`imexctl.doctor.run` runs them in order.  docs/operations.md lists them.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from pathlib import Path
from typing import Final

from imexctl import slurm as var
from imexctl.channels import devices
from imexctl.doctor.framework import FAIL, OK, WARN, Check, Context, under_root
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import job_ids, read_state
from imexctl.platform import versions

__all__ = [
    "auth_checks",
    "config_checks",
    "dir_checks",
    "log_checks",
    "mount_fs",
    "stale_checks",
    "version_checks",
    "writable_dir_checks",
]


def config_checks(ctx: Context) -> list[Check]:
    """The config file the hooks read under slurmd (``schema.find_config`` with slurmd's ``SLURM_CONF``)."""
    from imexctl.config import schema

    path, _ = schema.find_config(ctx.config or None, ctx.env, slurm_conf=var.value(ctx.env, var.CONF))
    return [_config_file(ctx, path), _config_files(ctx, path)]


def _config_file(ctx: Context, path: str) -> Check:
    if ctx.config_problem:
        why = f"{ctx.config_problem} (the other checks use the built-in defaults)"
        fix = f"correct {path}: every prolog on this tray exits 78 until then (docs/configuration.md)"
        return Check("imexctl.config", FAIL, why, fix)
    slurm_conf = var.value(ctx.env, var.CONF)
    beside = (
        f", beside SLURM_CONF={slurm_conf}"
        if slurm_conf and os.path.dirname(path) == os.path.dirname(slurm_conf)
        else ""
    )
    if ctx.rt.settings.source is None:
        return Check("imexctl.config", OK, f"{path} (the file the hooks read{beside}) is absent: built-in defaults")
    return Check("imexctl.config", OK, f"{path} (the file the hooks read{beside}) parses")


def _config_files(ctx: Context, path: str) -> Check:
    """WARN when more than one file sits where imexctl looks: only one of them counts."""
    from imexctl.config import schema

    candidates = schema.config_candidates(ctx.env, slurm_conf=var.value(ctx.env, var.CONF))
    present = [c for c in candidates if os.path.isfile(c)] if not ctx.config else []
    if len(present) > 1:
        ignored = ", ".join(c for c in present if c != path)
        why = f"several config files: the hooks read {path}, and {ignored} is ignored"
        return Check(
            "imexctl.config_files", WARN, why, "keep one file (docs/configuration.md says where imexctl looks)"
        )
    return Check("imexctl.config_files", OK, f"no other config file where imexctl looks ({len(present)} found)")


def auth_checks(ctx: Context) -> list[Check]:
    """The prolog's check of ``[auth]``'s files (imexctl/imex/peerauth.py), run without a job."""
    from imexctl.imex import peerauth

    auth = ctx.rt.settings.auth
    if auth.enabled == "no":
        return [Check("imexctl.auth", OK, "peer authentication off ([auth] enabled = no)")]
    found = peerauth.problems(ctx.rt.settings)
    if found:
        fix = "give each file to root, keys mode 0600, certificates 0644, in a root-only directory (docs/security.md)"
        return [Check("imexctl.auth", FAIL, f"{'; '.join(found)}; every prolog on this tray exits 78", fix)]
    names = ", ".join(str(f.path) for f in peerauth.files(ctx.rt.settings))
    return [Check("imexctl.auth", OK, f"mode {auth.mode}: {names}: regular files of root's, keys private")]


def dir_checks(ctx: Context) -> list[Check]:
    """run_dir, its jobs/ and the channel directory must be root's alone; log directories not world-writable."""
    s = ctx.rt.settings
    strict = [s.paths.run_dir, s.paths.jobs_dir]
    if s.policy.channels == "job":
        strict.append(s.paths.channel_dir)
    logs = list(dict.fromkeys([s.paths.imex_log_file.parent, *([s.paths.log_file.parent] if s.paths.log_file else [])]))
    problems = [why for path in strict if (why := _unsafe_dir(path, 0o022))]
    problems += [why for path in logs if (why := _unsafe_dir(path, 0o002))]
    if problems:
        fix = "make each directory root's and not writable by others (chown root:root, chmod 0755), or remove it"
        return [Check("imexctl.dirs", FAIL, "; ".join(problems), fix)]
    shown = ", ".join(str(p) for p in [*strict, *logs])
    return [Check("imexctl.dirs", OK, f"{shown}: absent (created when needed) or owned by root, not shared")]


def _unsafe_dir(path: Path, forbidden: int) -> str:
    """Why ``path`` is not a safe directory ('' when it is, or when it does not exist yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (imexctl never follows one)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {st.st_uid}, not root"
    mode = stat.S_IMODE(st.st_mode)
    if mode & forbidden and not (forbidden == 0o002 and mode & stat.S_ISVTX):
        return f"{path} has mode {mode:04o} (writable by {'others' if forbidden == 0o002 else 'group or others'})"
    return ""


#: file systems whose files are gone at the next boot: tmpfs and ramfs, and ``rootfs``, the initramfs root
#: that stateless images (Warewulf's default, BCM's and xCAT's diskless nodes) run from
VOLATILE_FS: Final = frozenset({"tmpfs", "ramfs", "rootfs"})
#: journald's configuration: the main file, then the drop-ins by file name (the first directory that has a
#: name wins), as ``man journald.conf`` orders them
_JOURNALD_DROPINS: Final = (
    "/etc/systemd/journald.conf.d",
    "/run/systemd/journald.conf.d",
    "/usr/local/lib/systemd/journald.conf.d",
    "/usr/lib/systemd/journald.conf.d",
)
#: an rsyslog action that sends elsewhere: ``action(type="omfwd" ...)``, RELP, or a legacy ``@host``/``@@host``
_RSYSLOG_REMOTE: Final = re.compile(r"""type\s*=\s*"om(fwd|relp)"|^\s*\S+\s+@@?[\w\[(]""", re.MULTILINE)
#: a syslog-ng destination that sends elsewhere (its sources use the same drivers, hence only destinations)
_SYSLOGNG_DEST: Final = re.compile(r"destination\s+\S+\s*\{([^}]*)\}", re.DOTALL)
_SYSLOGNG_REMOTE: Final = re.compile(r"\b(network|syslog|tcp6?|udp6?)\s*\(")


def log_checks(ctx: Context) -> list[Check]:
    """WARN when the hooks' log lines would not outlive a reboot: no log file on a disk, nothing kept or forwarded.

    The lines outlive a reboot when ``[paths] log_file`` lies on a file system
    that is not volatile (:data:`VOLATILE_FS`), or when ``[log] syslog = yes``
    and either journald keeps its journal on one (``Storage=persistent``, or
    ``auto`` with ``/var/log/journal`` present) or something sends syslog
    elsewhere (an rsyslog ``omfwd``/``omrelp``/``@host`` action, a syslog-ng
    network destination, ``systemd-journal-upload.service`` enabled).  Which
    file system holds a path is read from ``/proc/self/mountinfo`` (the longest
    mount point above it); without it nothing is judged.
    """
    mounts = _mounts(under_root(ctx, "/proc/self/mountinfo"))
    if mounts is None:
        return [Check("imexctl.logs", OK, "not checked: /proc/self/mountinfo cannot be read")]
    s = ctx.rt.settings
    kept: list[str] = []
    lost: list[str] = []
    if s.paths.log_file is not None:
        path = _on_node(ctx, s.paths.log_file)
        fs = mount_fs(mounts, path)
        (lost if fs in VOLATILE_FS else kept).append(f"{path} is on {fs}")
    else:
        lost.append("[paths] log_file is empty")
    if s.log.syslog == "yes":
        found = [why for why in (_journal_kept(ctx, mounts), _forwarded(ctx)) if why]
        kept += found
        if not found:
            lost.append("[log] syslog = yes, but the journal is not kept on a disk and nothing forwards syslog")
    else:
        lost.append("[log] syslog = no")
    if kept:
        return [Check("imexctl.logs", OK, f"the hooks' lines outlive a reboot: {'; '.join(kept)}")]
    fix = (
        "keep them: [log] syslog = yes with journald Storage=persistent on a disk or a remote syslog (rsyslog "
        "omfwd), or [paths] log_file on a disk (docs/install.md#stateless-images)"
    )
    return [Check("imexctl.logs", WARN, f"the hooks' lines are lost at a reboot: {'; '.join(lost)}", fix)]


def _on_node(ctx: Context, path: Path) -> str:
    """A path under ``[paths] root`` as the node names it."""
    rel = os.path.relpath(path, ctx.rt.settings.paths.root)
    return "/" if rel == "." else "/" + rel


def _mounts(path: Path) -> dict[str, str] | None:
    """Mount point -> file system type, from a ``mountinfo`` file (None when it cannot be read).

    A mount point mounted twice keeps its last (topmost) entry.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) > sep + 1:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out[point] = fields[sep + 1]
    return out


def mount_fs(mounts: dict[str, str], path: str) -> str:
    """The type of the file system that holds ``path``: its longest mount point ('unknown' without one)."""
    best = ""
    for point in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best = point
    return mounts.get(best, "unknown") if best else "unknown"


def _journal_kept(ctx: Context, mounts: dict[str, str]) -> str:
    """Why journald keeps the lines across a reboot ('' when it does not, or when systemd does not run here)."""
    if not under_root(ctx, "/run/systemd/system").is_dir():
        return ""
    storage = _journald_storage(ctx)
    journal = "/var/log/journal"
    present = under_root(ctx, journal).is_dir()
    if storage == "persistent" or (storage == "auto" and present):
        fs = mount_fs(mounts, journal)
        if fs not in VOLATILE_FS:
            return f"journald Storage={storage} keeps {journal} on {fs}"
    return ""


def _journald_storage(ctx: Context) -> str:
    """The ``Storage=`` of journald's configuration files (default ``auto``)."""
    names: dict[str, str] = {}
    for d in reversed(_JOURNALD_DROPINS):
        names.update({os.path.basename(f): f for f in glob.glob(str(under_root(ctx, d) / "*.conf"))})
    files = [str(under_root(ctx, "/etc/systemd/journald.conf")), *(names[n] for n in sorted(names))]
    storage = "auto"
    for f in files:
        section = ""
        for raw in _read(f).splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Journal" and line.startswith("Storage="):
                storage = line.partition("=")[2].strip()
    return storage


def _forwarded(ctx: Context) -> str:
    """What sends syslog to another machine ('' when nothing does)."""
    for f in ["/etc/rsyslog.conf", *_glob(ctx, "/etc/rsyslog.d/*.conf")]:
        if _RSYSLOG_REMOTE.search(_uncommented(_read(str(under_root(ctx, f))))):
            return f"rsyslog forwards it ({f})"
    for f in ["/etc/syslog-ng/syslog-ng.conf", *_glob(ctx, "/etc/syslog-ng/conf.d/*.conf")]:
        text = _uncommented(_read(str(under_root(ctx, f))))
        if any(_SYSLOGNG_REMOTE.search(body) for body in _SYSLOGNG_DEST.findall(text)):
            return f"syslog-ng forwards it ({f})"
    if _glob(ctx, "/etc/systemd/system/*.wants/systemd-journal-upload.service"):
        return "systemd-journal-upload.service forwards the journal"
    return ""


def _glob(ctx: Context, pattern: str) -> list[str]:
    """Node paths matching ``pattern`` under ``[paths] root``, sorted."""
    root = str(ctx.rt.settings.paths.root).rstrip("/")
    return sorted(f[len(root) :] if root else f for f in glob.glob(root + pattern))


def _uncommented(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return ""


def writable_dir_checks(ctx: Context) -> list[Check]:
    """WARN when anybody but root may replace the hooks' log file or metrics file: who may write their directories.

    The hooks accept a directory that its group may write (``log.dir_problem``:
    Ubuntu's ``/var/log`` is ``root:syslog 0775``), and refuse one that others
    may write or that root does not own.  In the first, a member of the group
    can rename a file of their own over ``imexctl.log`` (the hooks then log to
    stderr only, ``imexctl why`` leaves it out) or over ``imexctl.prom``
    (node_exporter serves their numbers); in the second the hooks write
    nothing there.  Issue 41.
    """
    return [_log_dir(ctx), _metrics_dir(ctx)]


def _log_dir(ctx: Context) -> Check:
    """``imexctl.log_dir``: ``[paths] log_file``'s directory, and the file at its name."""
    log_file = ctx.rt.settings.paths.log_file
    if log_file is None:
        return Check("imexctl.log_dir", OK, "[paths] log_file is empty: no log file")
    where, name = _on_node(ctx, log_file.parent), log_file.name
    kind, shown = _dir_writers(log_file.parent, where)
    if kind == "absent":
        return Check("imexctl.log_dir", OK, f"{where} is absent: the hooks create it root's, mode 0755")
    problems, fixes = [], []
    if kind == "refused":
        problems.append(f"{shown}: the hooks refuse it: they write no log file there (stderr only)")
        fixes.append(f"chown root {where} && chmod o-w {where}, or [paths] log_file in a directory of root's alone")
    elif kind == "group":
        problems.append(
            f"{shown}: a member can replace {name} with a file of their own (the hooks then log to stderr only, "
            "and imexctl why leaves it out)"
        )
        fixes.append(
            f"[paths] log_file = {where.rstrip('/')}/imexctl/{name} (a directory of root's alone: the hooks "
            "create it mode 0755) and the same path in /etc/logrotate.d/imexctl; chmod g-w only where nothing "
            "else writes the directory (not Ubuntu's /var/log: rsyslog writes there as syslog)"
        )
    foreign = _not_roots_file(log_file)
    if foreign:
        shown_file = _on_node(ctx, log_file)
        problems.append(f"{shown_file} {foreign}: the hooks refuse it (stderr only) and imexctl why leaves it out")
        fixes.append(f"remove {shown_file} (the next hook creates it root's, mode 0640)")
    if problems:
        return Check("imexctl.log_dir", WARN, "; ".join(problems), "; ".join(fixes))
    return Check("imexctl.log_dir", OK, f"{shown}: only root can replace {name} there")


def _metrics_dir(ctx: Context) -> Check:
    """``imexctl.metrics_dir``: ``[metrics] textfile_dir``, where node_exporter reads ``imexctl.prom``."""
    directory = ctx.rt.settings.metrics.textfile_dir
    if not directory:
        return Check("imexctl.metrics_dir", OK, "[metrics] textfile_dir is empty: no metrics")
    path = under_root(ctx, directory)
    where = _on_node(ctx, path)
    kind, shown = _dir_writers(path, where)
    if kind == "absent":
        why = f"{where} does not exist: every metrics write fails (metrics.failed)"
        return Check("imexctl.metrics_dir", WARN, why, f"install -d -m 0755 -o root -g root {where}")
    if kind == "refused":
        why = f"{shown}: the hooks refuse it: every metrics write fails (metrics.failed)"
        fix = f"chown root {where} && chmod o-w {where}"
        return Check("imexctl.metrics_dir", WARN, why, fix)
    if kind == "group":
        why = f"{shown}: a member can replace imexctl.prom with a file of their own, and node_exporter serves it"
        fix = (
            f"chmod g-w {where} (node_exporter only reads it), or [metrics] textfile_dir and node_exporter's "
            "--collector.textfile.directory in a directory of root's alone"
        )
        return Check("imexctl.metrics_dir", WARN, why, fix)
    return Check("imexctl.metrics_dir", OK, f"{shown}: only root can replace imexctl.prom there")


def _dir_writers(path: Path, where: str) -> tuple[str, str]:
    """Who may write the directory ``path`` (``where`` on the node), by the hooks' rule (``log.dir_problem``).

    Returns ``(kind, text)``: ``absent``; ``refused`` (not a directory, not
    root's, or others may write it: the hooks write nothing there); ``group``
    (its group may write it, which the hooks accept); ``''`` (root's alone).
    Symlinks are followed, as the hooks follow them.
    """
    from imexctl.platform.log import dir_problem

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "absent", where
    except OSError as exc:
        return "refused", f"{where}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "refused", f"{where} is not a directory"
    mode = stat.S_IMODE(st.st_mode)
    if dir_problem(path):
        return "refused", f"{where}: not root's, or others may write it (owner uid {st.st_uid}, mode {mode:04o})"
    if mode & stat.S_IWGRP:
        return "group", f"{where}: group {_group_name(st.st_gid)} may write it (mode {mode:04o})"
    return "", f"{where}: root's, mode {mode:04o}"


def _group_name(gid: int) -> str:
    """A group's name, or its number when it has none."""
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _not_roots_file(path: Path) -> str:
    """Why the file at ``path`` is not root's record ('' when it is, or absent): ``imexctl why``'s rule."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        what = "" if stat.S_ISREG(st.st_mode) else ", not a regular file"
        return f"is not root's record (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}{what})"
    return ""


def stale_checks(ctx: Context) -> list[Check]:
    """Jobs that left a directory or a daemon but no longer run here, and channel nodes no job claims.

    Judged only while no prolog or epilog runs: the node lock is tried once,
    never waited for (``hooks_idle``).  A hook that holds it is mid-flight
    (a prolog's state before its mark, an epilog's daemon being stopped),
    and what it left so far is no fault: both checks are then OK, "in
    progress".
    """
    from imexctl.hooks.jobs import epilog_pending, known_jobs, still_runs
    from imexctl.hooks.state import hooks_idle
    from imexctl.platform.errors import FileError

    rt = ctx.rt
    try:
        with hooks_idle(rt.settings.paths.lock_file, create=False) as idle:
            if not idle:
                return _in_progress(rt)
            # cleanup's rule: what cleanup would remove
            ended = [jid for jid in known_jobs(rt) if not still_runs(jid, rt).runs]
            pending = [jid for jid in ended if epilog_pending(jid, rt)]  # an epilog began and may still be working
            gone = [jid for jid in ended if jid not in pending]
            if pending and not gone:
                return _in_progress(rt)
            channels = _stale_channels(rt, set(ended)) if rt.settings.policy.channels == "job" else None
    except FileError as exc:
        if os.geteuid() == 0:
            raise  # the hooks refuse this lock too: the group's FAIL says why
        why = f"not judged as uid {os.geteuid()}: {exc}"
        return [Check("imexctl.stale", WARN, why, "run imexctl doctor as root")]
    out = []
    if gone:
        names = ", ".join(f"job {jid} ({_left_by(jid, rt)})" for jid in gone)
        out.append(
            Check(
                "imexctl.stale",
                FAIL,
                f"left by jobs that no longer run here: {names}; the next prolog refuses this tray",
                "imexctl cleanup (imexctl cleanup --dry-run shows what it removes)",
            )
        )
    else:
        out.append(Check("imexctl.stale", OK, "no IMEX domain, daemon or job directory of a gone job"))
    if channels is not None:
        out.append(channels)
    return out


def _in_progress(rt: Runtime) -> list[Check]:
    """Both checks while a hook holds the node lock: nothing is judged, nothing fails."""
    why = "not judged now: a prolog or epilog holds the node lock (in progress); the next run judges it"
    out = [Check("imexctl.stale", OK, why)]
    if rt.settings.policy.channels == "job":
        out.append(Check("imexctl.channels", OK, why))
    return out


def _left_by(job_id: int, rt: Runtime) -> str:
    """What job ``job_id`` left: its directory, and its daemon by the one liveness rule (``jobs.daemon_left``)."""
    from imexctl.hooks.jobs import daemon_left

    jd = rt.settings.paths.job(job_id)
    left = ["directory"] if jd.exists() else []
    left += [d] if (d := daemon_left(job_id, rt, read_state(jd))) else []
    return ", ".join(left) or "nothing"


def _stale_channels(rt: Runtime, ended: set[int]) -> Check:
    """Channel nodes no job claims (not channel0), by cleanup's rule.

    A job that may still run (not in ``ended``, which cleanup tears down)
    whose state cannot be read may claim any of them: while one does, they
    are not called unclaimed, and cleanup leaves them.
    """
    paths = rt.settings.paths
    states = {j: read_state(paths.job(j)) for j in job_ids(paths.jobs_dir)}
    claimed = {st.channel_minor for st in states.values() if st is not None}
    stray = [c for c in devices.list_channels(paths.channel_dir) if c.minor != 0 and c.minor not in claimed]
    if not stray:
        return Check("imexctl.channels", OK, f"no channel node in {paths.channel_dir} outside a job")
    names = ", ".join(f"{c.path.name} (uid {c.uid}, mode {c.mode:04o})" for c in stray)
    unread = ", ".join(str(j) for j, st in states.items() if st is None and j not in ended)
    if unread:
        return Check(
            "imexctl.channels",
            WARN,
            f"channel nodes that no readable state claims: {names}; the state of job {unread} cannot be read, "
            "and it may claim any of them",
            f"imexctl cleanup leaves them while it cannot: see why the state.json of job {unread} is unreadable",
        )
    return Check(
        "imexctl.channels",
        WARN,
        f"channel nodes that no job claims: {names}; their owners can still open them",
        "imexctl cleanup removes them (channel0 is left alone)",
    )


def version_checks(ctx: Context) -> list[Check]:
    """``imexctl.version``: the package's version in use, and an installed one that is not (a refused switch).

    A switch that the new version refused keeps the old version in use and
    lets the package manager finish (pkg/imexctl-switch): the tray works, on
    the version it ran, until the cause is fixed and the switch run again.
    Read from ``/opt/imexctl`` under ``[paths] root`` (imexctl/platform/versions.py).
    """
    import sys

    from imexctl import __version__

    top = under_root(ctx, versions.TOP)
    found = versions.read(str(top))
    if not found.packaged:
        said = f"imexctl {__version__} from {sys.prefix}: no package's versions in {top}"
        return [Check("imexctl.version", OK, said)]
    active = found.active
    if active is None:
        why = f"no version in use: {top}/current is missing or leads to no version: every hook fails"
        return [Check("imexctl.version", FAIL, why, f"run {versions.SWITCH}")]
    if not found.pending:
        return [Check("imexctl.version", OK, f"{active.version} installed and in use ({top}/current)")]
    return [_pending(found, build, active) for build in found.pending]


def _pending(found: versions.Versions, build: versions.Build, active: versions.Build) -> Check:
    """The FAIL of one installed build that is not in use: which, why, and how the switch is completed."""
    import time

    refusal = found.refused(build)
    name = f"another build of {build.version}" if build.version == active.version else build.version
    if refusal is None:
        why = f"{name} is installed but not in use: {versions.WHYS['not_switched']}; the hooks run {active.version}"
        return Check("imexctl.version", FAIL, why, f"run {versions.SWITCH}")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(refusal.time)) if refusal.time else "at an unknown time"
    why = (
        f"{name} is installed but not in use: its switch was refused {when}, {versions.WHYS[refusal.why]} "
        f"({refusal.reason}); the hooks run {active.version}"
    )
    if refusal.why == "rebuilt":
        fix = "install that build under a version of its own (a new Debian revision or RPM release)"
    else:
        fix = f"fix what it names, then run {versions.SWITCH} (or dpkg-reconfigure imexctl); jobs run on meanwhile"
    return Check("imexctl.version", FAIL, why, fix)
