"""``imexctl doctor``: find what would fail a job's prolog on this tray, before a job does.

Each check reports ``OK``, ``WARN`` or ``FAIL`` with one line of evidence and,
unless it is OK, one line saying how to fix it.  The exit code (0 = no FAIL)
is meant for a node health check (NHC, slurm.conf ``HealthCheckProgram``).
Doctor only reads: it starts, stops and writes nothing, and every file it reads
is taken under ``[paths] root`` so tests can give it a whole fake ``/proc``,
``/sys`` and ``/etc``.  The checks live in three modules: this one (imexctl
itself), :mod:`imexctl.doctor.slurm` (slurm.conf) and :mod:`imexctl.doctor.host`
(IMEX, ports, NVML).  docs/operations.md lists them.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Final

from imexctl.channels import devices
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import job_ids, read_state
from imexctl.platform.errors import ImexctlError

__all__ = [
    "CHECK_NAMES",
    "FAIL",
    "OK",
    "WARN",
    "Check",
    "Context",
    "as_json",
    "exit_code",
    "render_text",
    "run",
    "under_root",
]

#: every check's name, in report order (``nvml.gpu<N>`` stands for one per GPU); docs/operations.md lists them
CHECK_NAMES: Final = (
    "imexctl.config",
    "imexctl.config_files",
    "imexctl.auth",
    "imexctl.dirs",
    "imexctl.stale",
    "imexctl.channels",
    "slurm.conf",
    "slurm.version",
    "slurm.prolog",
    "slurm.epilog",
    "slurm.prolog_flags",
    "slurm.prolog_timeout",
    "slurm.epilog_timeout",
    "slurm.timeout_keys",
    "slurm.partitions",
    "slurm.switch",
    "slurm.topology",
    "resolve.self",
    "resolve.nodes",
    "imex.binaries",
    "imex.version",
    "imex.stock_unit",
    "imex.unit",
    "imex.channel_device",
    "imex.channel_count",
    "ports.ephemeral",
    "ports.listening",
    "nvml.fabric",
    "nvml.gpu<N>",
    "containers.toolkit",
    "containers.toolkit.version",
    "containers.toolkit.config",
    "containers.toolkit.imex_requests",
    "containers.toolkit.imex_creation",
    "containers.toolkit.unprivileged_env",
    "containers.cdi",
    "containers.enroot",
    "containers.enroot.hook",
    "containers.enroot.other_hooks",
    "containers.enroot.environment",
    "containers.channel0",
)
_COMMAND_TIMEOUT_S: Final = 10.0
OK: Final = "OK"
WARN: Final = "WARN"
FAIL: Final = "FAIL"


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding: a stable dotted ``name``, its status, the evidence and the fix."""

    name: str
    status: str
    message: str
    fix: str = ""

    def data(self) -> dict[str, str]:
        """The ``--json`` form: name, status, message, fix."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Context:
    """What every check may read: the runtime (settings, host, GPU), the environment, the node."""

    rt: Runtime
    env: Mapping[str, str]
    node: str
    #: ``--slurm-conf``: the slurm.conf to read instead of the lookup
    slurm_conf: Path | None = None
    #: why the config file did not load ('' when it did; the checks then run with the defaults)
    config_problem: str = ""
    #: ``--nodes``: a host list whose names are resolved as the prolog would ('' for none)
    nodes: str = ""
    #: ``--config``: the config file named on the command line ('' for the hooks' lookup)
    config: str = ""


CheckFn = Callable[[Context], list[Check]]


def under_root(ctx: Context, path: str) -> Path:
    """An absolute system path (``/proc/...``) taken under ``[paths] root``."""
    return ctx.rt.settings.paths.root / path.lstrip("/")


def run(ctx: Context) -> list[Check]:
    """Every check, in a fixed order; a check that breaks is reported as a FAIL, never raised."""
    from imexctl.doctor import host as hostcheck
    from imexctl.doctor import resolve as resolvecheck
    from imexctl.doctor import slurm as slurmcheck

    groups: list[tuple[str, CheckFn]] = [
        ("imexctl.config", _config),
        ("imexctl.auth", _auth),
        ("imexctl.dirs", _dirs),
        ("imexctl.stale", _stale),
        ("slurm", slurmcheck.checks),
        ("resolve", resolvecheck.checks),
        ("imex", hostcheck.imex_checks),
        ("ports", hostcheck.port_checks),
        ("nvml", hostcheck.nvml_checks),
        ("containers", _containers),
    ]
    out: list[Check] = []
    for name, fn in groups:
        try:
            out += fn(ctx)
        except Exception as exc:  # one broken check must not hide the others
            why = str(exc) if isinstance(exc, ImexctlError) else f"{type(exc).__name__}: {exc}"
            out.append(Check(name, FAIL, f"the check could not run: {why}", "see the message; run as root"))
    # one line each: a command's stderr may have several
    return [dataclasses.replace(c, message=" ".join(c.message.split())) for c in out]


def exit_code(checks: list[Check]) -> int:
    """0 when no check failed, else 1 (what a node health check acts on)."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def render_text(checks: list[Check]) -> str:
    """One line per check, the fix indented below it, and a closing count."""
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name}: {c.message}")
        if c.fix and c.status != OK:
            lines.append(f"      fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    lines.append(f"{counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- imexctl itself


def _containers(ctx: Context) -> list[Check]:
    """The container runtimes' IMEX settings (imexctl/doctor/containers.py; docs/containers.md)."""
    from imexctl.doctor import containers

    paths = ctx.rt.settings.paths
    ctk = under_root(ctx, containers.TOOLKIT_VERSION_ARGV[0])
    version = None
    if ctk.is_file():
        try:
            done = ctx.rt.host.run((str(ctk), *containers.TOOLKIT_VERSION_ARGV[1:]), timeout_s=_COMMAND_TIMEOUT_S)
            version = done.stdout
        except ImexctlError as exc:
            version = f"(could not run: {exc})"
    found = containers.run_all(paths.root, channel_dir=paths.channel_dir, toolkit_version=version)
    return [Check(c.name, c.status, c.message, c.fix) for c in found]


def _config(ctx: Context) -> list[Check]:
    """The config file the hooks read under slurmd (``schema.find_config`` with slurmd's ``SLURM_CONF``)."""
    from imexctl.config import schema

    path, _ = schema.find_config(ctx.config or None, ctx.env)
    return [_config_file(ctx, path), _config_files(ctx, path)]


def _config_file(ctx: Context, path: str) -> Check:
    if ctx.config_problem:
        why = f"{ctx.config_problem} (the other checks use the built-in defaults)"
        fix = f"correct {path}: every prolog on this tray exits 78 until then (docs/configuration.md)"
        return Check("imexctl.config", FAIL, why, fix)
    slurm_conf = ctx.env.get("SLURM_CONF", "")
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

    present = [c for c in schema.config_candidates(ctx.env) if os.path.isfile(c)] if not ctx.config else []
    if len(present) > 1:
        ignored = ", ".join(c for c in present if c != path)
        why = f"several config files: the hooks read {path}, and {ignored} is ignored"
        return Check(
            "imexctl.config_files", WARN, why, "keep one file (docs/configuration.md says where imexctl looks)"
        )
    return Check("imexctl.config_files", OK, f"no other config file where imexctl looks ({len(present)} found)")


def _auth(ctx: Context) -> list[Check]:
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


def _dirs(ctx: Context) -> list[Check]:
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


def _stale(ctx: Context) -> list[Check]:
    """Jobs that left a directory or a daemon but no longer run here, and channel nodes no job claims."""
    from imexctl.hooks.jobs import known_jobs, still_runs

    rt = ctx.rt
    gone = [jid for jid in known_jobs(rt) if not still_runs(jid, rt)]  # cleanup's rule: what cleanup would remove
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
    if rt.settings.policy.channels == "job":
        out.append(_stale_channels(rt))
    return out


def _left_by(job_id: int, rt: Runtime) -> str:
    from imexctl.imex import daemon

    jd = rt.settings.paths.job(job_id)
    left = ["directory"] if jd.exists() else []
    procs = daemon.job_processes(rt.host, rt.settings, jd.config)
    left += [f"daemon pid {procs[0].pid}"] if procs else []
    return ", ".join(left) or "nothing"


def _stale_channels(rt: Runtime) -> Check:
    paths = rt.settings.paths
    claimed = {st.channel_minor for j in job_ids(paths.jobs_dir) if (st := read_state(paths.job(j)))}
    stray = [c for c in devices.list_channels(paths.channel_dir) if c.minor != 0 and c.minor not in claimed]
    if not stray:
        return Check("imexctl.channels", OK, f"no channel node in {paths.channel_dir} outside a job")
    names = ", ".join(f"{c.path.name} (uid {c.uid}, mode {c.mode:04o})" for c in stray)
    return Check(
        "imexctl.channels",
        WARN,
        f"channel nodes that no job claims: {names}; their owners can still open them",
        "imexctl cleanup removes them (channel0 is left alone)",
    )


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    """The ``data`` list of ``imexctl doctor --json``."""
    return [c.data() for c in checks]
