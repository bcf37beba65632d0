"""imexctl configuration: an INI file validated against one schema.

Every key has a built-in default; a missing default config file means "all
defaults".  Unknown sections or keys, wrong types and a file that anyone but
root may write are errors that name file, section and key.  Reference:
docs/configuration.md (kept in sync with ``SCHEMA`` by tests).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from imexctl.errors import ConfigError

__all__ = [
    "AUTH_FILE_KEYS",
    "AUTH_IMEX_KEYS",
    "DEFAULT_CONFIG",
    "OWNED_IMEX_KEYS",
    "SCHEMA",
    "SECTIONS",
    "Auth",
    "Commands",
    "Daemon",
    "JobDir",
    "Log",
    "Metrics",
    "Paths",
    "PathsSection",
    "Policy",
    "Ports",
    "Readiness",
    "Resolve",
    "Settings",
    "Topology",
    "find_config",
    "load",
]

DEFAULT_CONFIG = Path("/etc/imexctl/imexctl.conf")

# config.cfg's peer-authentication keys: imexctl writes them from [auth] (imexctl/peerauth.py), which
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


Parser = Callable[[str], Any]


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


def _key(default: str, parse: Parser) -> Any:
    """One configuration key: its default as written in the file, and its parser."""
    return dataclasses.field(metadata={"default": default, "parse": parse})


# One frozen dataclass per section: the fields are the keys, typed as parsed.
# Defaults go through the parser too.  SCHEMA (below) is derived from these and
# is the one source of docs/configuration.md's key tables (tests/test_docs.py).


@dataclasses.dataclass(frozen=True)
class PathsSection:
    """``[paths]`` as written: absolute paths, resolved under ``root`` into :class:`Paths`."""

    root: str = _key("/", _abs_path)
    run_dir: str = _key("/run/imexctl", _abs_path)
    channel_dir: str = _key("/dev/nvidia-caps-imex-channels", _abs_path)
    proc_devices: str = _key("/proc/devices", _abs_path)
    log_file: str = _key("/var/log/imexctl.log", _opt_abs_path)
    imex_log_file: str = _key("/var/log/nvidia-imex.log", _abs_path)
    hosts_file: str = _key("/etc/imexctl/hosts", _abs_path)
    # the NVLink-domain source chosen by [topology] source (topology.conf, topology.yaml or a NODE KEY map)
    topology_file: str = _key("", _opt_abs_path)
    # a NODE KEY map (imexctl topology blocks --map) that the prolog checks this tray's NVML key against
    topology_map: str = _key("", _opt_abs_path)
    # the driver's module parameters; ImexChannelCount bounds the channel minor
    nvidia_params: str = _key("/proc/driver/nvidia/params", _abs_path)


@dataclasses.dataclass(frozen=True)
class Commands:
    """``[commands]``: absolute paths of the programs imexctl runs."""

    nvidia_imex: str = _key("/usr/bin/nvidia-imex", _abs_path)
    nvidia_imex_ctl: str = _key("/usr/bin/nvidia-imex-ctl", _abs_path)
    systemctl: str = _key("/usr/bin/systemctl", _abs_path)
    # asked only on a failing prolog (was the job cancelled?) and for het jobs (their other components)
    scontrol: str = _key("/usr/bin/scontrol", _abs_path)


@dataclasses.dataclass(frozen=True)
class Daemon:
    """``[daemon]``: how the job's daemon is started and stopped."""

    backend: str = _key("systemd", _choice("systemd", "exec"))
    unit: str = _key("imexctl-imex", _name)
    stock_unit: str = _key("nvidia-imex.service", _service)
    start_timeout_s: float = _key("30", _number(float, 1, 600))
    stop_timeout_s: float = _key("15", _number(float, 1, 600))
    kill_grace_s: float = _key("5", _number(float, 0.1, 120))
    lock_timeout_s: float = _key("30", _number(float, 0.1, 600))


@dataclasses.dataclass(frozen=True)
class Policy:
    """``[policy]``: which jobs get a domain, channels, the NVML fabric check."""

    jobs: str = _key("all", _choice("all", "partitions", "feature"))
    partitions: tuple[str, ...] = _key("", _csv)
    feature: str = _key("imex", _name)
    shared: str = _key("refuse", _choice("refuse", "skip"))
    channels: str = _key("job", _choice("job", "none"))
    channel_mode: int = _key("0600", _mode)
    channel_count: int = _key("2048", _number(int, 2, 1 << 20))
    fabric: str = _key("nvml", _choice("nvml", "none"))
    # how long a GPU whose fabric registration is NOT_STARTED/IN_PROGRESS is waited for (docs/nvml.md)
    fabric_wait_s: float = _key("20", _number(float, 0, 600))
    fabric_limited: str = _key("warn", _choice("warn", "refuse"))
    # a job with one tray in this NVLink domain: a one-tray IMEX domain, only the channel, or nothing
    single_tray: str = _key("domain", _choice("domain", "channel", "none"))


@dataclasses.dataclass(frozen=True)
class Readiness:
    """``[readiness]``: what "ready" means and how long to wait for it."""

    level: str = _key("domain", _choice("local", "domain"))
    deadline_s: float = _key("60", _number(float, 0.1, 3600))
    poll_initial_s: float = _key("0.03", _number(float, 0.001, 10))
    poll_max_s: float = _key("1.0", _number(float, 0.001, 60))
    ctl_timeout_s: float = _key("5", _number(float, 0.1, 120))
    # how -q reaches the local daemon: "config" (nvidia-imex-ctl -c <job config>) or
    # "ip" (-i <tray address> <command port>); -N always uses -c
    ctl_address: str = _key("config", _choice("config", "ip"))
    # yes: a tray whose domain is not UP only because a live peer reports itself not
    # ready exits 0 and leaves the failure (and the drain) to that peer; Slurm may then
    # start the batch script once before it requeues the job (docs/design.md)
    blame_peers: str = _key("no", _choice("yes", "no"))


@dataclasses.dataclass(frozen=True)
class Slurm:
    """``[slurm]``: what imexctl takes from slurm.conf and asks slurmctld."""

    # keep the readiness deadline below slurm.conf's PrologTimeout/PrologEpilogTimeout
    cap_deadline: str = _key("yes", _choice("yes", "no"))
    timeout_margin_s: float = _key("10", _number(float, 0, 600))
    # a prolog about to fail asks slurmctld whether the job was cancelled meanwhile
    check_cancelled: str = _key("yes", _choice("yes", "no"))
    query_timeout_s: float = _key("3", _number(float, 0.1, 60))
    # het jobs: one IMEX domain over all components (joint) or one per component
    het_jobs: str = _key("joint", _choice("joint", "per_component"))


@dataclasses.dataclass(frozen=True)
class Ports:
    """``[ports]``: the per-job port ranges."""

    server_port_range: tuple[int, int] = _key("61000-61999", _port_range)
    # the command service (nvidia-imex-ctl): reached over the network by -N from every tray
    cmd_port_range: tuple[int, int] = _key("62000-62999", _port_range)


@dataclasses.dataclass(frozen=True)
class Resolve:
    """``[resolve]``: how tray names become addresses."""

    method: str = _key("dns", _choice("dns", "hosts_file"))


def _opt_name(v: str) -> str:
    return _name(v) if v else ""


@dataclasses.dataclass(frozen=True)
class Topology:
    """``[topology]``: where the NVLink domains (Slurm blocks) come from (docs/topology.md)."""

    # auto: topology_conf when [paths] topology_file is set, none otherwise (load() resolves it)
    source: str = _key("auto", _choice("auto", "topology_conf", "topology_yaml", "map", "none"))
    # the topology of topology.yaml to read; empty: the file's only block topology
    yaml_topology: str = _key("", _opt_name)


@dataclasses.dataclass(frozen=True)
class Log:
    """``[log]``: imexctl's own log."""

    level: str = _key("info", _choice("debug", "info", "warning", "error"))
    # also send every line to syslog (the journal on systemd hosts), ident "imexctl"
    syslog: str = _key("no", _choice("yes", "no"))


@dataclasses.dataclass(frozen=True)
class Metrics:
    """``[metrics]``: the Prometheus text file for node_exporter's textfile collector (docs/metrics.md)."""

    # empty: no metrics; else a directory (taken under [paths] root) that gets imexctl.prom after each run
    textfile_dir: str = _key("", _opt_abs_path)


def _cfg_path(v: str) -> str:
    # written into config.cfg as KEY=<path>: a blank or '#' there may not mean what it says (not confirmed)
    if v and (not v.isprintable() or any(c in v for c in " \t#")):
        raise ValueError("must be a path without blanks, '#' or non-printing characters")
    return _opt_abs_path(v)


def _host_name(v: str) -> str:
    if v and not all(c.isascii() and (c.isalnum() or c in ".-_:") for c in v):
        raise ValueError("must be a host name (letters, digits, '.', '-', '_', ':')")
    return v


@dataclasses.dataclass(frozen=True)
class Auth:
    """``[auth]``: IMEX peer authentication and encryption (docs/security.md#imex-peer-authentication).

    Written into each job's config.cfg as ``IMEX_ENABLE_AUTH_ENCRYPTION`` and the keys
    that go with it; the files are taken under ``[paths] root`` and checked before the
    daemon starts (imexctl/peerauth.py).
    """

    enabled: str = _key("no", _choice("yes", "no"))
    # IMEX_AUTH_ENCRYPTION_MODE, spelled as in config.cfg (design.md source imex-auth)
    mode: str = _key("SSL_TLS", _choice("SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY"))
    # mode = SSL_TLS: the six files (IMEX_AUTH_SOURCE=FILE); the same file may serve server and client
    server_key: str = _key("", _cfg_path)
    server_cert: str = _key("", _cfg_path)
    server_cert_auth: str = _key("", _cfg_path)
    client_key: str = _key("", _cfg_path)
    client_cert: str = _key("", _cfg_path)
    client_cert_auth: str = _key("", _cfg_path)
    security_target_override: str = _key("", _host_name)


SECTIONS: Mapping[str, type] = {
    "paths": PathsSection,
    "commands": Commands,
    "daemon": Daemon,
    "policy": Policy,
    "readiness": Readiness,
    "slurm": Slurm,
    "ports": Ports,
    "resolve": Resolve,
    "topology": Topology,
    "log": Log,
    "metrics": Metrics,
    "auth": Auth,
}

# section -> key -> (default text, parser), in file order.
SCHEMA: dict[str, dict[str, tuple[str, Parser]]] = {
    name: {f.name: (f.metadata["default"], f.metadata["parse"]) for f in dataclasses.fields(cls)}
    for name, cls in SECTIONS.items()
}

JOB_FILES = ("config.cfg", "nodes_config.cfg", "state.json", "daemon.pid")


@dataclasses.dataclass(frozen=True)
class JobDir:
    """One job's directory on a node, ``<run_dir>/jobs/<job id>/``, and every file in it."""

    job_id: int
    path: Path

    @property
    def config(self) -> Path:
        """The daemon's complete ``config.cfg``."""
        return self.path / "config.cfg"

    @property
    def nodes(self) -> Path:
        """The nodes file, one address per line."""
        return self.path / "nodes_config.cfg"

    @property
    def state(self) -> Path:
        """What the prolog set up (``state.json``)."""
        return self.path / "state.json"

    @property
    def pid_file(self) -> Path:
        """The exec backend's record of the daemon (``daemon.pid``)."""
        return self.path / "daemon.pid"

    def exists(self) -> bool:
        """Whether the directory (or anything at its path) exists."""
        return os.path.lexists(self.path)


@dataclasses.dataclass(frozen=True)
class Paths:
    """Every path imexctl reads or writes on a node, already under ``root``."""

    root: Path
    run_dir: Path
    channel_dir: Path
    proc_devices: Path
    log_file: Path | None
    imex_log_file: Path
    hosts_file: Path
    topology_file: Path | None
    topology_map: Path | None
    nvidia_params: Path

    @property
    def jobs_dir(self) -> Path:
        """Directory holding one subdirectory per job that owns (or owned) the domain."""
        return self.run_dir / "jobs"

    @property
    def lock_file(self) -> Path:
        """The per-node lock serialising prologs, epilogs and cleanup."""
        return self.run_dir / "lock"

    def job(self, job_id: int) -> JobDir:
        """The job's directory and files."""
        return JobDir(job_id, self.jobs_dir / str(job_id))


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated configuration: one typed, frozen object per section."""

    source: Path | None
    paths: Paths
    commands: Commands
    daemon: Daemon
    policy: Policy
    readiness: Readiness
    slurm: Slurm
    ports: Ports
    resolve: Resolve
    topology: Topology
    log: Log
    metrics: Metrics
    auth: Auth
    imex: Mapping[str, str]

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``section__key=value`` overrides (values already parsed)."""
        sections: dict[str, Any] = {}
        for name, value in changes.items():
            section, _, key = name.partition("__")
            if section == "paths" or section not in SECTIONS or key not in SCHEMA[section]:
                raise KeyError(name)
            sections[section] = dataclasses.replace(sections.get(section, getattr(self, section)), **{key: value})
        return dataclasses.replace(self, **sections)


def find_config(explicit: str | None, env: Mapping[str, str]) -> tuple[Path | None, bool]:
    """Choose the config file: ``--config``, ``$IMEXCTL_CONFIG``, beside ``$SLURM_CONF``, default.

    Returns:
        The path (or None) and whether it must exist.
    """
    if explicit:
        return Path(explicit), True
    if env.get("IMEXCTL_CONFIG"):
        return Path(env["IMEXCTL_CONFIG"]), True
    slurm_conf = env.get("SLURM_CONF")
    if slurm_conf:
        beside = Path(slurm_conf).parent / "imexctl.conf"
        if beside.is_file():
            return beside, True
    return DEFAULT_CONFIG, False


def load(path: Path | None, *, node: str, required: bool = True, euid: int | None = None) -> Settings:
    """Read and validate the configuration for this node.

    Args:
        path: the INI file, or None for built-in defaults.
        node: the Slurm node name, substituted for ``%n`` in ``[paths] root``.
        required: whether a missing file is an error (False for the default path).
        euid: the effective uid (default: this process's); the file must be owned by root or by it.

    Raises:
        ConfigError: naming file, section and key.
    """
    raw: dict[str, dict[str, str]] = {}
    source: Path | None = None
    if path is not None:
        text = _read_config(path, required=required, euid=os.geteuid() if euid is None else euid)
        if text is not None:
            raw, source = _parse_ini(path, text), path
    sections: dict[str, Any] = {}
    for name, keys in SCHEMA.items():
        given = raw.pop(name, {})
        values = {
            key: _parse_value(path, name, key, given.pop(key, default), parse) for key, (default, parse) in keys.items()
        }
        if given:
            _fail(path, name, min(given), "unknown key")
        sections[name] = SECTIONS[name](**values)
    imex = _imex_section(path, raw.pop("imex", {}))
    if raw:
        _fail(path, min(raw), None, f"unknown section (known: {', '.join([*SCHEMA, 'imex'])})")
    _cross_check(path, sections)
    _auth_check(path, sections["auth"], imex)
    sections["topology"] = _topology(path, sections["topology"], sections["paths"])
    paths = _paths(sections.pop("paths"), node)
    return Settings(source=source, paths=paths, imex=imex, **sections)


def _read_config(path: Path, *, required: bool, euid: int) -> str | None:
    try:
        # O_NONBLOCK: a FIFO would block the open until a writer appears; checked before reading,
        # so a FIFO or /dev/zero is refused instead of read forever
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{path}: not a regular file")
            if st.st_uid not in (0, euid) or st.st_mode & 0o022:
                raise ConfigError(
                    f"{path}: config file must be owned by root and not writable by group or others "
                    f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
                )
            data = f.read()
        _check_config_dirs(path, euid)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: config file not found") from None
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc


def _check_config_dirs(path: Path, euid: int) -> None:
    """Refuse a config file in a directory that anyone but root may write: they could replace the file.

    Both the directory the path names and, for a symlinked file, the directory of
    the file it leads to; symlinks are followed and the real directory is judged and named.
    """
    for d in dict.fromkeys((Path(os.path.realpath(path.parent)), Path(os.path.realpath(path)).parent)):
        st = os.stat(d)
        if st.st_uid not in (0, euid) or st.st_mode & 0o022:
            raise ConfigError(
                f"{path}: config directory {d} must be owned by root and not writable by group or others "
                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
            )


def _parse_ini(path: Path, text: str) -> dict[str, dict[str, str]]:
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=True, default_section="\0none")
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        # the line number and text are on the message's later lines: keep them, on one line
        raise ConfigError(f"{path}: {' '.join(part.strip() for part in exc.message.splitlines())}") from exc
    return {s: dict(parser.items(s)) for s in parser.sections()}


def _parse_value(path: Path | None, section: str, key: str, text: str, parse: Parser) -> Any:
    try:
        return parse(text.strip())
    except ValueError as exc:
        _fail(path, section, key, f"{text.strip()!r} {exc}")


def _imex_section(path: Path | None, given: dict[str, str]) -> dict[str, str]:
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


def _cross_check(path: Path | None, sections: Mapping[str, Any]) -> None:
    policy, readiness, ports = sections["policy"], sections["readiness"], sections["ports"]
    if policy.jobs == "partitions" and not policy.partitions:
        _fail(path, "policy", "partitions", "must list partitions when jobs = partitions")
    if readiness.poll_initial_s > readiness.poll_max_s:
        _fail(path, "readiness", "poll_initial_s", "must not exceed poll_max_s")
    (s_lo, s_hi), (c_lo, c_hi) = ports.server_port_range, ports.cmd_port_range
    if s_lo <= c_hi and c_lo <= s_hi:
        _fail(path, "ports", "cmd_port_range", "must not overlap server_port_range (a job needs both ports)")


#: [auth] keys that name the six files of mode = SSL_TLS, in config.cfg order
AUTH_FILE_KEYS = ("server_key", "server_cert", "server_cert_auth", "client_key", "client_cert", "client_cert_auth")


def _auth_check(path: Path | None, auth: Auth, imex: Mapping[str, str]) -> None:
    """The [auth] keys and [imex]'s GSSAPI keys must fit ``enabled`` and ``mode`` (docs/configuration.md#auth)."""
    tls_keys = [*AUTH_FILE_KEYS, "security_target_override"]
    gss = [k for k in sorted(imex) if k in GSS_IMEX_KEYS]
    if auth.enabled == "no":
        for key in tls_keys:
            if getattr(auth, key):
                _fail(path, "auth", key, "is set but [auth] enabled = no: set enabled = yes, or remove the key")
        if gss:
            _fail(path, "imex", gss[0], "is a GSSAPI setting but [auth] enabled = no")
        return
    if auth.mode == "SSL_TLS":
        for key in AUTH_FILE_KEYS:
            if not getattr(auth, key):
                _fail(path, "auth", key, "is required with mode = SSL_TLS (the daemons authenticate both ways)")
        if gss:
            _fail(path, "imex", gss[0], "is a GSSAPI setting, but [auth] mode = SSL_TLS")
        return
    for key in tls_keys:
        if getattr(auth, key):
            _fail(path, "auth", key, f"is a TLS setting, but mode = {auth.mode} (GSSAPI uses the Kerberos keytab)")


def _topology(path: Path | None, topo: Topology, paths: PathsSection) -> Topology:
    """Check the topology keys against ``[paths]`` and resolve ``source = auto``."""
    source = topo.source
    if source == "auto":
        source = "topology_conf" if paths.topology_file else "none"
    if source != "none" and not paths.topology_file:
        _fail(path, "topology", "source", f"{source} needs [paths] topology_file")
    if source == "none" and paths.topology_file:
        _fail(path, "paths", "topology_file", "is set but [topology] source = none would ignore it")
    if paths.topology_map and source not in ("topology_conf", "topology_yaml"):
        _fail(path, "paths", "topology_map", f"checks a topology_conf or topology_yaml source, not {source}")
    if topo.yaml_topology and source != "topology_yaml":
        _fail(path, "topology", "yaml_topology", "needs source = topology_yaml")
    return dataclasses.replace(topo, source=source)


def _paths(p: PathsSection, node: str) -> Paths:
    root = Path(p.root.replace("%n", node))

    def under(v: str) -> Path:
        return root / v.lstrip("/")

    return Paths(
        root=root,
        run_dir=under(p.run_dir),
        channel_dir=under(p.channel_dir),
        proc_devices=under(p.proc_devices),
        log_file=under(p.log_file) if p.log_file else None,
        imex_log_file=under(p.imex_log_file),
        hosts_file=under(p.hosts_file),
        topology_file=under(p.topology_file) if p.topology_file else None,
        topology_map=under(p.topology_map) if p.topology_map else None,
        nvidia_params=under(p.nvidia_params),
    )


def _fail(path: Path | None, section: str, key: str | None, reason: str) -> Any:
    where = f"{path or '<defaults>'}: [{section}]" + (f" {key}" if key else "")
    raise ConfigError(f"{where}: {reason}")
