"""The configuration's schema and its validation, light enough for a hook's fast path.

Every key of imexctl.conf: its default as written in the file and the parser
that checks and converts it, section by section in file order (``SCHEMA``),
and the checks that span keys.  :mod:`imexctl.config.settings` builds its typed,
frozen objects from what :func:`validate` returns; the fast path of the hooks
(:mod:`imexctl.hooks.entry`) validates with the same functions before it decides
that a job is skipped or left nothing behind.  The typed records every tier
hands the hooks' gates (:mod:`imexctl.hooks.gate`) are defined here too:
:class:`Policy` (``[policy]``) and :class:`NodePaths` (this node's ``[paths]``,
from :func:`node_paths`); the settings hold the same records.

It also reads the file, in the one INI grammar imexctl takes
(:func:`parse_ini_subset`), on every path: hooks, fast path, admin commands,
doctor and the job's own user (:mod:`imexctl.channels.job`).

This module imports only ``os``, ``stat`` and :mod:`imexctl.platform` (``Record``)
at run time: ``dataclasses``,
``pathlib``, ``typing`` and ``enum`` each cost a hook 5 to 20 ms to import
(docs/performance.md).  Errors are :class:`SchemaError`;
``settings`` raises them as ``ConfigError``.
"""

from __future__ import annotations

import os
import stat

from imexctl.platform import Record

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Callable

    Parser = Callable[[str], Any]

__all__ = [
    "AUTH_FILE_KEYS",
    "AUTH_IMEX_KEYS",
    "DEFAULT_CONFIG",
    "GSS_IMEX_KEYS",
    "IMEX_KEYS",
    "OWNED_IMEX_KEYS",
    "SCHEMA",
    "NodePaths",
    "Policy",
    "SchemaError",
    "config_candidates",
    "find_config",
    "job_dir",
    "node_paths",
    "parse_ini_subset",
    "parse_key",
    "read_config",
    "read_trusted",
    "validate",
    "where",
]

DEFAULT_CONFIG = "/etc/imexctl/imexctl.conf"


class SchemaError(Exception):
    """An invalid or unreadable config file; the message names file, section and key.

    ``line`` is the file's line of a line that does not parse; ``section`` and
    ``key`` what a value's check names (``key`` None for a whole section): where
    the file gives it, :func:`where` finds its line.
    """

    line: int | None = None
    section: str | None = None
    key: str | None = None


# config.cfg's peer-authentication keys: imexctl writes them from [auth] (imexctl/imex/peerauth.py), which
# checks them and their files before the daemon starts
AUTH_IMEX_KEYS = frozenset(
    {
        "IMEX_ENABLE_AUTH_ENCRYPTION",
        "IMEX_AUTH_ENCRYPTION_MODE",
        "IMEX_AUTH_SOURCE",
        "IMEX_SERVER_KEY",
        "IMEX_SERVER_CERT",
        "IMEX_SERVER_CERT_AUTH",
        "IMEX_CLIENT_KEY",
        "IMEX_CLIENT_CERT",
        "IMEX_CLIENT_CERT_AUTH",
        "IMEX_SECURITY_TARGET_OVERRIDE",
    }
)
# IMEX config.cfg keys imexctl decides itself; [imex] may not override them.
OWNED_IMEX_KEYS = frozenset(
    {
        *AUTH_IMEX_KEYS,
        "SERVER_PORT",
        "IMEX_NODE_CONFIG_FILE",
        "BIND_INTERFACE_IP",
        "DAEMONIZE",
        "LOG_FILE_NAME",
        "IMEX_CMD_ENABLED",
        "IMEX_CMD_PORT",
        "IMEX_CMD_BIND_INTERFACE_IP",
        "IMEX_CMD_UNIX_DOMAIN_PATH",
    }
)
# The GSSAPI tuning keys, passed through [imex]; only with [auth] mode = GSS_AUTH_ENCRYPT or GSS_AUTH_ONLY
GSS_IMEX_KEYS = frozenset(
    {
        "IMEX_GSS_SERVICE_NAME",
        "IMEX_GSS_TIMEOUT_SEC",
        "IMEX_GSS_RETRY_INTERVAL_SEC",
        "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC",
        "IMEX_GSS_SHUTDOWN_ON_FAILURE",
    }
)
# Keys of NVIDIA's config.cfg (design.md source imex-config) a site may set through [imex].
IMEX_KEYS = frozenset(
    {
        "LOG_LEVEL",
        "STATS_FILE_NAME",
        "LOG_APPEND_TO_LOG",
        "LOG_FILE_MAX_SIZE",
        "LOG_MAX_ROTATE_COUNT",
        "LOG_USE_SYSLOG",
        "NETWORK_INTERFACE",
        "IMEX_WAIT_FOR_QUORUM",
        *GSS_IMEX_KEYS,
        "IMEX_NODE_DISCONNECTED_GRACE_TIME",
    }
)


def _abs_path(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError("must be an absolute path")
    return os.path.normpath(v)


def _opt_abs_path(v: str) -> str:
    return _abs_path(v) if v else ""


def _choice(*options: str) -> Parser:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return v

    return parse


def _number(kind: Callable[[str], Any], lo: float, hi: float) -> Parser:
    def parse(v: str) -> Any:
        try:
            n = kind(v)
        except ValueError:
            raise ValueError(f"must be a{'n integer' if kind is int else ' number'}") from None
        if not lo <= n <= hi:
            # ".15g", not "g": "g" prints the channel_count limit 1048576 as 1.04858e+06
            raise ValueError(f"must be between {lo:.15g} and {hi:.15g}")
        return n

    return parse


def _mode(v: str) -> int:
    try:
        m = int(v, 8)
    except ValueError:
        raise ValueError("must be an octal mode such as 0600") from None
    if m & ~0o666:
        raise ValueError("must be a subset of 0666 (no execute, setuid or sticky bits)")
    return m


def _port_range(v: str) -> tuple[int, int]:
    lo_s, sep, hi_s = v.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s if sep else lo_s)
    except ValueError:
        raise ValueError("must be LOW-HIGH, e.g. 61000-61999") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError("must satisfy 1024 <= LOW <= HIGH <= 65535")
    return lo, hi


def _csv(v: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in v.split(",") if p.strip())


def _name(v: str) -> str:
    # a unit name goes into systemctl's argv: a NUL there would make the command impossible to run
    if not v or not v.isprintable() or any(c in v for c in "/ \t\n@"):
        raise ValueError("must be a plain name without '/', '@', blanks or non-printing characters")
    return v


def _service(v: str) -> str:
    # systemctl show keys its output by the canonical Id ("nvidia-imex.service"); a
    # short name would never match it and the "stock unit is running" check would pass.
    if not _name(v).endswith(".service") or v == ".service":
        raise ValueError("must be a full unit name ending in .service, e.g. nvidia-imex.service")
    return v


def _opt_name(v: str) -> str:
    return _name(v) if v else ""


def _cfg_path(v: str) -> str:
    # written into config.cfg as KEY=<path>: a blank or '#' there may not mean what it says (not confirmed)
    if v and (not v.isprintable() or any(c in v for c in " \t#")):
        raise ValueError("must be a path without blanks, '#' or non-printing characters")
    return _opt_abs_path(v)


def _host_name(v: str) -> str:
    if v and not all(c.isascii() and (c.isalnum() or c in ".-_:") for c in v):
        raise ValueError("must be a host name (letters, digits, '.', '-', '_', ':')")
    return v


# section -> key -> (default as written in the file, parser), in file order.  The default goes through
# the parser too.  settings.SECTIONS has one frozen dataclass per section with these fields
# (tests/config/test_settings.py).
SCHEMA: dict[str, dict[str, tuple[str, Parser]]] = {
    "paths": {
        "root": ("/", _abs_path),
        "run_dir": ("/run/imexctl", _abs_path),
        "channel_dir": ("/dev/nvidia-caps-imex-channels", _abs_path),
        "proc_devices": ("/proc/devices", _abs_path),
        "log_file": ("/var/log/imexctl.log", _opt_abs_path),
        "imex_log_file": ("/var/log/nvidia-imex.log", _abs_path),
        "hosts_file": ("/etc/imexctl/hosts", _abs_path),
        # the NVLink-domain source chosen by [topology] source (topology.conf, topology.yaml or a NODE KEY map)
        "topology_file": ("", _opt_abs_path),
        # a NODE KEY map (imexctl topology blocks --map) that the prolog checks this tray's NVML key against
        "topology_map": ("", _opt_abs_path),
        # the driver's module parameters; ImexChannelCount bounds the channel minor
        "nvidia_params": ("/proc/driver/nvidia/params", _abs_path),
    },
    "commands": {
        "nvidia_imex": ("/usr/bin/nvidia-imex", _abs_path),
        "nvidia_imex_ctl": ("/usr/bin/nvidia-imex-ctl", _abs_path),
        "systemctl": ("/usr/bin/systemctl", _abs_path),
        # a failing hook's drain of its own node, imexctl health (show node, update) and doctor (version)
        "scontrol": ("/usr/bin/scontrol", _abs_path),
        # what slurmctld says about a job, when a prolog must ask (slurm/slurmctld.py)
        "squeue": ("/usr/bin/squeue", _abs_path),
    },
    "daemon": {
        "backend": ("systemd", _choice("systemd", "exec")),
        "unit": ("imexctl-imex", _name),
        "stock_unit": ("nvidia-imex.service", _service),
        "start_timeout_s": ("30", _number(float, 1, 600)),
        "stop_timeout_s": ("15", _number(float, 1, 600)),
        "kill_grace_s": ("5", _number(float, 0.1, 120)),
        "lock_timeout_s": ("30", _number(float, 0.1, 600)),
        # how long the epilog waits, before it stops the daemon, for the job user's processes that still hold
        # the NVIDIA driver (a daemon that ends under them kills them: docs/design.md); 0: no wait
        "process_wait_s": ("20", _number(float, 0, 600)),
    },
    "policy": {
        "jobs": ("all", _choice("all", "partitions", "feature")),
        "partitions": ("", _csv),
        "feature": ("imex", _name),
        "shared": ("skip", _choice("skip", "refuse")),
        "channels": ("job", _choice("job", "none")),
        "channel_mode": ("0600", _mode),
        "channel_count": ("2048", _number(int, 2, 1 << 20)),
        "fabric": ("nvml", _choice("nvml", "none")),
        # how long a GPU whose fabric registration is NOT_STARTED/IN_PROGRESS is waited for (docs/nvml.md)
        "fabric_wait_s": ("20", _number(float, 0, 600)),
        "fabric_limited": ("warn", _choice("warn", "refuse")),
        # a job with one tray in this NVLink domain: a one-tray IMEX domain, only the channel, or nothing
        "single_tray": ("domain", _choice("domain", "channel", "none")),
        # a job's daemon that ended before the job: the epilog warns (and counts it), or also drains the tray
        "lost_daemon": ("warn", _choice("warn", "drain")),
    },
    "readiness": {
        "level": ("domain", _choice("local", "domain")),
        "deadline_s": ("60", _number(float, 0.1, 3600)),
        "poll_initial_s": ("0.03", _number(float, 0.001, 10)),
        # the pauses between probes are a twentieth of the time waited so far, within these two bounds
        "poll_max_s": ("1.0", _number(float, 0.001, 60)),
        "ctl_timeout_s": ("5", _number(float, 0.1, 120)),
        # how -q reaches the local daemon: "config" (nvidia-imex-ctl -c <job config>) or
        # "ip" (-i <tray address> <command port>); -N always uses -c
        "ctl_address": ("config", _choice("config", "ip")),
        # yes: a tray whose domain is not UP only because a live peer reports itself not
        # ready exits 0 and leaves the failure (and the drain) to that peer; Slurm may then
        # start the batch script once before it requeues the job (docs/design.md)
        "blame_peers": ("no", _choice("yes", "no")),
    },
    "slurm": {
        # keep the readiness deadline below slurm.conf's PrologTimeout/PrologEpilogTimeout
        "cap_deadline": ("yes", _choice("yes", "no")),
        "timeout_margin_s": ("10", _number(float, 0, 600)),
        # a prolog about to fail asks slurmctld whether the job was cancelled meanwhile
        "check_cancelled": ("yes", _choice("yes", "no")),
        # Slurm 22.05 sets neither SLURM_JOB_OVERSUBSCRIBE nor SLURM_JOB_EXCLUSIVE: ask slurmctld once
        "ask_sharing": ("yes", _choice("yes", "no")),
        "query_timeout_s": ("3", _number(float, 0.1, 60)),
        # a hook that fails for a fault of its tray drains its node with its own reason first (sinfo -R)
        "drain_reason": ("yes", _choice("yes", "no")),
        # het jobs: one IMEX domain over all components (joint) or one per component
        "het_jobs": ("joint", _choice("joint", "per_component")),
    },
    "ports": {
        "server_port_range": ("61000-61999", _port_range),
        # the command service (nvidia-imex-ctl): reached over the network by -N from every tray
        "cmd_port_range": ("62000-62999", _port_range),
    },
    "resolve": {
        "method": ("dns", _choice("dns", "hosts_file", "slurm_conf")),
    },
    "topology": {
        # auto: topology_conf when [paths] topology_file is set, none otherwise (load() resolves it)
        "source": ("auto", _choice("auto", "topology_conf", "topology_yaml", "map", "none")),
        # the topology of topology.yaml to read; empty: the file's only block topology
        "yaml_topology": ("", _opt_name),
    },
    "log": {
        "level": ("info", _choice("debug", "info", "warning", "error")),
        # also send every line to syslog (the journal on systemd hosts), ident "imexctl"
        "syslog": ("no", _choice("yes", "no")),
    },
    "metrics": {
        # empty: no metrics; else a directory (taken under [paths] root) that gets imexctl.prom after each run
        "textfile_dir": ("", _opt_abs_path),
    },
    "auth": {
        "enabled": ("no", _choice("yes", "no")),
        # IMEX_AUTH_ENCRYPTION_MODE, spelled as in config.cfg (design.md source imex-auth)
        "mode": ("SSL_TLS", _choice("SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY")),
        # mode = SSL_TLS: the six files (IMEX_AUTH_SOURCE=FILE); the same file may serve server and client
        "server_key": ("", _cfg_path),
        "server_cert": ("", _cfg_path),
        "server_cert_auth": ("", _cfg_path),
        "client_key": ("", _cfg_path),
        "client_cert": ("", _cfg_path),
        "client_cert_auth": ("", _cfg_path),
        "security_target_override": ("", _host_name),
    },
    "containers": {
        # the enroot hook, for a job with a channel on this tray, when it cannot show the container
        # exactly that channel: open lets the container start as enroot set it up (and warns), closed
        # stops it (docs/containers.md#when-the-hook-fails); a job without one is never stopped
        "on_error": ("open", _choice("open", "closed")),
    },
}

#: [auth] keys that name the six files of mode = SSL_TLS, in config.cfg order
AUTH_FILE_KEYS = ("server_key", "server_cert", "server_cert_auth", "client_key", "client_cert", "client_cert_auth")


class Policy(Record):
    """``[policy]``: which jobs get a domain, channels, the NVML fabric check."""

    jobs: str
    partitions: tuple[str, ...]
    feature: str
    shared: str
    channels: str
    channel_mode: int
    channel_count: int
    fabric: str
    fabric_wait_s: float
    fabric_limited: str
    single_tray: str
    lost_daemon: str


class NodePaths(Record):
    """``[paths]`` for this node, as plain strings under ``root`` (``schema.node_paths``); '' for one not set.

    The gates' view of where things lie; :class:`imexctl.config.paths.Paths`
    holds the same as ``pathlib`` paths for the rest of the hooks.  The job's
    own user reads only some (the rest stay '').
    """

    root: str = ""
    run_dir: str = ""
    channel_dir: str = ""
    proc_devices: str = ""
    log_file: str = ""
    imex_log_file: str = ""
    hosts_file: str = ""
    topology_file: str = ""
    topology_map: str = ""
    nvidia_params: str = ""


def find_config(explicit: str | None, env: Mapping[str, str], *, slurm_conf: str) -> tuple[str, bool]:
    """Choose the config file: ``--config``, ``$IMEXCTL_CONFIG``, beside ``slurm_conf``, default.

    ``slurm_conf`` is the value of slurmd's ``SLURM_CONF`` (``slurm.value(env, slurm.CONF)``:
    this layer reads no Slurm variable itself).

    Returns:
        The path and whether it must exist.
    """
    if explicit:
        return explicit, True
    if env.get("IMEXCTL_CONFIG"):
        return env["IMEXCTL_CONFIG"], True
    beside = _beside(slurm_conf)
    if beside and os.path.isfile(beside):
        return beside, True
    return DEFAULT_CONFIG, False


def _beside(slurm_conf: str) -> str:
    """``imexctl.conf`` in the directory of ``slurm_conf`` ('' without one)."""
    if not slurm_conf:
        return ""
    parent = _parent(slurm_conf)
    return "imexctl.conf" if parent == "." else os.path.join(parent, "imexctl.conf")


def config_candidates(env: Mapping[str, str], *, slurm_conf: str) -> tuple[str, ...]:
    """Every config file that :func:`find_config` could choose by ``env`` and ``slurm_conf``, in its order (doctor)."""
    found = (env.get("IMEXCTL_CONFIG", ""), _beside(slurm_conf), DEFAULT_CONFIG)
    return tuple(dict.fromkeys(path for path in found if path))


def _parent(path: str) -> str:
    """``str(pathlib.PurePosixPath(path).parent)`` without importing pathlib."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    head = "/" if path.startswith("/") else ""
    return head + "/".join(parts[:-1]) or "."


def read_config(path: str, *, required: bool, euid: int) -> str | None:
    """The config file's text, as the hooks and the admin's commands read it; None when missing and not ``required``.

    Raises:
        SchemaError: not a regular file, writable by others than root (or in a
            directory that is), unreadable, or not UTF-8.
    """
    text = read_trusted(path, required=required, trusted=lambda st: st.st_uid in (0, euid) and not st.st_mode & 0o022)
    if text is not None:
        try:
            _check_config_dirs(path, euid)
        except OSError as exc:
            raise SchemaError(f"{path}: cannot read config file: {exc.strerror}") from exc
    return text


def read_trusted(
    path: str, *, required: bool, trusted: Callable[[os.stat_result], bool], max_bytes: int | None = None
) -> str | None:
    """A config file's text if ``trusted`` accepts its owner and mode; None when missing and not ``required``.

    Symlinks are followed: the file they lead to is what is checked.  The one
    reader of the config file's bytes: :func:`read_config` for the hooks, and
    the job's side (``channels.job``, where the owner is judged through the
    user namespace's uid map, and the size is capped at ``max_bytes``).

    Raises:
        SchemaError: not a regular file, not trusted, larger than ``max_bytes``, unreadable, or not UTF-8.
    """
    try:
        # O_NONBLOCK: a FIFO would block the open until a writer appears; checked before reading,
        # so a FIFO or /dev/zero is refused instead of read forever
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SchemaError(f"{path}: not a regular file")
            if not trusted(st):
                raise SchemaError(
                    f"{path}: config file must be owned by root and not writable by group or others "
                    f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
                )
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except FileNotFoundError:
        if required:
            raise SchemaError(f"{path}: config file not found") from None
        return None
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read config file: {exc.strerror}") from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise SchemaError(f"{path}: larger than {max_bytes} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text") from exc


def _check_config_dirs(path: str, euid: int) -> None:
    """Refuse a config file in a directory that anyone but root may write: they could replace the file.

    Both the directory the path names and, for a symlinked file, the directory of
    the file it leads to; symlinks are followed and the real directory is judged and named.
    """
    for d in dict.fromkeys((os.path.realpath(_parent(path)), os.path.dirname(os.path.realpath(path)))):
        st = os.stat(d)
        if st.st_uid not in (0, euid) or st.st_mode & 0o022:
            raise SchemaError(
                f"{path}: config directory {d} must be owned by root and not writable by group or others "
                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
            )


def parse_ini_subset(text: str, path: str | None = None) -> dict[str, dict[str, str]]:
    """The sections and keys of a config file, in the one grammar imexctl reads (docs/configuration.md#syntax).

    Line by line: blank, a comment (``#`` or ``;`` first, indented or not), a
    ``[section]`` header or ``key = value``, both in the first column.  The key
    is what stands before the first ``=``, the value what follows it, both
    without blanks around them; nothing else is special (no inline comments, no
    ``%`` interpolation).  Names are case-sensitive; lines may end in CRLF.

    Raises:
        SchemaError: naming the file and the line of anything else: ``key: value``,
            an indented (continuation) line, a key outside a section or without
            ``=``, a section or a key given twice, ``[DEFAULT]``, a byte order mark.
    """
    out: dict[str, dict[str, str]] = {}
    seen: dict[tuple[str, str], int] = {}
    section: str | None = None
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.removesuffix("\r")
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        why = _line_problem(line, stripped, section)
        if not why and stripped[0] == "[":
            section = stripped[1:-1]
            why = _twice(seen, (section, ""), number, f"section [{section}]")
            out[section] = {}
        elif not why:
            key, _, value = stripped.partition("=")
            key = key.rstrip()
            assert section is not None
            why = _twice(seen, (section, key), number, f"[{section}] {key}")
            out[section][key] = value.strip()
        if why:
            shown = line if len(line) <= 80 else line[:77] + "..."
            error = SchemaError(f"{path or '<config>'}: line {number}: {why}: {shown!r}")
            error.line = number
            raise error
    return out


def _line_problem(line: str, stripped: str, section: str | None) -> str:
    """What is wrong with a line that is neither blank nor a comment ('' when nothing is)."""
    if line[0] == "\ufeff":
        return "a byte order mark: save the file as UTF-8 without one"
    if line[0].isspace():
        return "indented: continuation lines are not read; write the key and its value on one line"
    if "\r" in line:
        return "a carriage return inside the line"
    if stripped[0] == "[":
        name = stripped[1:-1]
        if stripped[-1] != "]" or not name or "[" in name or "]" in name:
            return "not a section header: write [name], with nothing after the ']'"
        if name != name.strip() or not name.isprintable():
            return "blanks or non-printing characters in a section name"
        if name == "DEFAULT":
            return "[DEFAULT] is not read (no key applies to every section): set each key in its section"
        return ""
    key, sep, _ = stripped.partition("=")
    if ":" in key:
        return "a ':' before the '=': write key = value ('key: value' is not read)"
    if not sep:
        return "not a [section], a comment or key = value"
    if not key.strip():
        return "no key before the '='"
    if section is None:
        return "a key before the first [section]"
    return ""


def _twice(seen: dict[tuple[str, str], int], name: tuple[str, str], number: int, shown: str) -> str:
    """'' the first time ``name`` is seen; else why ``number`` may not give it again."""
    if name in seen:
        return f"{shown} given again (first on line {seen[name]})"
    seen[name] = number
    return ""


def validate(path: str | None, raw: dict[str, dict[str, str]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every key of every section parsed (defaults for those not given), and the ``[imex]`` keys.

    ``raw`` is emptied as it is read.  ``[topology] source = auto`` comes back resolved.

    Raises:
        SchemaError: an unknown section or key, a bad value, or keys that do not fit together.
    """
    sections: dict[str, dict[str, Any]] = {}
    for name, keys in SCHEMA.items():
        given = raw.pop(name, {})
        sections[name] = {key: parse_key(path, name, key, given.pop(key, None)) for key in keys}
        if given:
            _fail(path, name, min(given), "unknown key")
    imex = _imex_section(path, raw.pop("imex", {}))
    if raw:
        _fail(path, min(raw), None, f"unknown section (known: {', '.join([*SCHEMA, 'imex'])})")
    _cross_check(path, sections)
    _auth_check(path, sections["auth"], imex)
    sections["topology"]["source"] = _topology_source(path, sections["topology"], sections["paths"])
    return sections, imex


#: each job's directory, ``<[paths] run_dir>/jobs/<job id>/``, and its files (``config.paths.JobDir`` names them)
JOBS_DIR, JOB_CONFIG, JOB_NODES, JOB_STATE, JOB_PID_FILE = (
    "jobs",
    "config.cfg",
    "nodes_config.cfg",
    "state.json",
    "daemon.pid",
)


def job_dir(run_dir: str, job_id: int) -> str:
    """The job's directory on a node: the one place its layout is written, for every path that needs it."""
    return os.path.join(run_dir, JOBS_DIR, str(job_id))


def node_paths(paths: Mapping[str, str], node: str) -> NodePaths:
    """``[paths]`` (as validated) for this node: ``%n`` in ``root`` replaced by ``node``, every other path under root.

    The one place that decides where a path lies on a node: for the settings
    (:meth:`imexctl.config.paths.Paths.of_node`), the hooks' fast tier and the
    job's own user (:mod:`imexctl.channels.job`, which gives only the keys it
    reads: the others stay '').  An optional path that is not set stays empty;
    a path of ``/`` is root itself.
    """
    root = paths["root"].replace("%n", node)

    def under(v: str) -> str:
        return os.path.join(root, v.lstrip("/")) if v.strip("/") else root if v else ""

    return NodePaths(**{key: root if key == "root" else under(v) for key, v in paths.items()})


def parse_key(path: str | None, section: str, key: str, text: str | None) -> Any:
    """``[section] key`` as ``text`` gives it (its default when None), parsed by ``SCHEMA``.

    Raises:
        SchemaError: a bad value, naming file, section and key.
    """
    default, parse = SCHEMA[section][key]
    text = default if text is None else text
    try:
        return parse(text.strip())
    except ValueError as exc:
        _fail(path, section, key, f"{text.strip()!r} {exc}")


def _imex_section(path: str | None, given: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in given.items():
        if key in AUTH_IMEX_KEYS:
            _fail(path, "imex", key, "is set by imexctl from [auth], which checks the files first")
        if key in OWNED_IMEX_KEYS:
            _fail(path, "imex", key, "is set by imexctl for every job and cannot be overridden")
        if key not in IMEX_KEYS:
            _fail(path, "imex", key, "unknown IMEX config.cfg key (see docs/configuration.md)")
        if "\n" in value.strip() or "#" in value:
            _fail(path, "imex", key, "value must be one line without '#'")
        out[key] = value.strip()
    return out


def _cross_check(path: str | None, sections: Mapping[str, Mapping[str, Any]]) -> None:
    policy, readiness, ports = sections["policy"], sections["readiness"], sections["ports"]
    if policy["jobs"] == "partitions" and not policy["partitions"]:
        _fail(path, "policy", "partitions", "must list partitions when jobs = partitions")
    if readiness["poll_initial_s"] > readiness["poll_max_s"]:
        _fail(path, "readiness", "poll_initial_s", "must not exceed poll_max_s")
    (s_lo, s_hi), (c_lo, c_hi) = ports["server_port_range"], ports["cmd_port_range"]
    if s_lo <= c_hi and c_lo <= s_hi:
        _fail(path, "ports", "cmd_port_range", "must not overlap server_port_range (a job needs both ports)")


def _auth_check(path: str | None, auth: Mapping[str, str], imex: Mapping[str, str]) -> None:
    """The [auth] keys and [imex]'s GSSAPI keys must fit ``enabled`` and ``mode`` (docs/configuration.md#auth)."""
    tls_keys = [*AUTH_FILE_KEYS, "security_target_override"]
    gss = [k for k in sorted(imex) if k in GSS_IMEX_KEYS]
    if auth["enabled"] == "no":
        for key in tls_keys:
            if auth[key]:
                _fail(path, "auth", key, "is set but [auth] enabled = no: set enabled = yes, or remove the key")
        if gss:
            _fail(path, "imex", gss[0], "is a GSSAPI setting but [auth] enabled = no")
        return
    if auth["mode"] == "SSL_TLS":
        for key in AUTH_FILE_KEYS:
            if not auth[key]:
                _fail(path, "auth", key, "is required with mode = SSL_TLS (the daemons authenticate both ways)")
        if gss:
            _fail(path, "imex", gss[0], "is a GSSAPI setting, but [auth] mode = SSL_TLS")
        return
    for key in tls_keys:
        if auth[key]:
            _fail(path, "auth", key, f"is a TLS setting, but mode = {auth['mode']} (GSSAPI uses the Kerberos keytab)")


def _topology_source(path: str | None, topo: Mapping[str, str], paths: Mapping[str, str]) -> str:
    """Check the topology keys against ``[paths]``; the source, with ``auto`` resolved."""
    source = topo["source"]
    if source == "auto":
        source = "topology_conf" if paths["topology_file"] else "none"
    if source != "none" and not paths["topology_file"]:
        _fail(path, "topology", "source", f"{source} needs [paths] topology_file")
    if source == "none" and paths["topology_file"]:
        _fail(path, "paths", "topology_file", "is set but [topology] source = none would ignore it")
    if paths["topology_map"] and source not in ("topology_conf", "topology_yaml"):
        _fail(path, "paths", "topology_map", f"checks a topology_conf or topology_yaml source, not {source}")
    if topo["yaml_topology"] and source != "topology_yaml":
        _fail(path, "topology", "yaml_topology", "needs source = topology_yaml")
    return source


def _fail(path: str | None, section: str, key: str | None, reason: str) -> Any:
    where = f"{path or '<defaults>'}: [{section}]" + (f" {key}" if key else "")
    error = SchemaError(f"{where}: {reason}")
    error.section, error.key = section, key
    raise error


def where(path: str, text: str | None, error: SchemaError) -> str:
    """``<file>:<line>`` of what ``error`` is about in the file ``text`` was read from, else ``<file>`` alone.

    ``<file>`` alone where no line of it is to blame: an unreadable file, a
    key left at its default.  A line that does not parse names itself; a bad
    value, an unknown key or section, the line that gives it (the grammar of
    :func:`parse_ini_subset`, which read the file whole before the check failed).
    """
    line = error.line
    if line is None and text is not None and error.section is not None:
        line = _line_of(text, error.section, error.key)
    return f"{path}:{line}" if line else path


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """The line that gives ``[section] key`` (``key`` None: the section's header) in a file that parses."""
    current = None
    for number, raw in enumerate(text.split("\n"), 1):
        stripped = raw.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped[0] == "[":
            current = stripped[1:-1]
            if key is None and current == section:
                return number
        elif current == section and key is not None and stripped.partition("=")[0].rstrip() == key:
            return number
    return None
