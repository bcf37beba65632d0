"""Read ``config.cfg`` and ``nodes_config.cfg`` the way the simulator understands them.

Shared by the simulated daemon and the simulated ``nvidia-imex-ctl``, so it
imports nothing heavy (no psutil, no asyncio, no dataclasses, hashlib only
where the daemon needs it): the ctl is started once per readiness probe, and
its start-up is most of a probe's cost (docs/performance.md).  Rules: design.md sources
imex-config, imex-nodes; where they say "not confirmed", the choice is written
in imexctl/sim/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple

__all__ = [
    "KNOWN_KEYS",
    "SimConfig",
    "SimConfigError",
    "load_config",
    "node_map_key",
    "parse_config_text",
    "parse_nodes_text",
    "read_nodes_file",
]

DEFAULT_CONFIG: Final = "/etc/nvidia-imex/config.cfg"

#: Keys of the shipped file (design.md source imex-config).
KNOWN_KEYS: Final = frozenset(
    {
        "LOG_LEVEL",
        "LOG_FILE_NAME",
        "STATS_FILE_NAME",
        "LOG_APPEND_TO_LOG",
        "LOG_FILE_MAX_SIZE",
        "LOG_MAX_ROTATE_COUNT",
        "LOG_USE_SYSLOG",
        "DAEMONIZE",
        "BIND_INTERFACE_IP",
        "SERVER_PORT",
        "IMEX_NODE_CONFIG_FILE",
        "NETWORK_INTERFACE",
        "IMEX_WAIT_FOR_QUORUM",
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
        "IMEX_GSS_SERVICE_NAME",
        "IMEX_GSS_TIMEOUT_SEC",
        "IMEX_GSS_RETRY_INTERVAL_SEC",
        "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC",
        "IMEX_GSS_SHUTDOWN_ON_FAILURE",
        "IMEX_CMD_ENABLED",
        "IMEX_CMD_BIND_INTERFACE_IP",
        "IMEX_CMD_PORT",
        "IMEX_CMD_UNIX_DOMAIN_PATH",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME",
    }
)

_QUORUM: Final = ("NONE", "RECOVERY", "FULL")
#: IMEX_AUTH_ENCRYPTION_MODE and IMEX_AUTH_SOURCE values (design.md source imex-auth)
_AUTH_MODES: Final = ("SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY")
_AUTH_SOURCES: Final = ("FILE", "ENV_PATH", "ENV_VAL")


class SimConfigError(ValueError):
    """A config or nodes file the simulator refuses; the message says why."""


class SimConfig(NamedTuple):
    """The ``config.cfg`` values the simulator acts on (defaults from design.md source imex-config).

    A NamedTuple, not a frozen dataclass: ``import dataclasses`` (with ``inspect``)
    and building the class cost the ctl about 9 ms of a probe's start-up.
    """

    path: str
    log_level: int = 4
    log_file_name: str = "/var/log/nvidia-imex.log"
    log_append: bool = True
    daemonize: bool = True
    bind_interface_ip: str = ""
    server_port: int = 50000
    node_config_file: str = "/etc/nvidia-imex/nodes_config.cfg"
    wait_for_quorum: str = "RECOVERY"
    cmd_enabled: bool = False
    cmd_bind_ip: str = ""
    cmd_port: int | None = None
    cmd_unix_path: str = ""
    grace_time_s: float = -1.0
    #: IMEX_AUTH_ENCRYPTION_MODE when IMEX_ENABLE_AUTH_ENCRYPTION=1, "" when off (never enforced)
    auth_mode: str = ""
    unknown_keys: tuple[str, ...] = ()
    bad_lines: tuple[int, ...] = ()


def _int(raw: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    """Return ``raw[key]`` as an int within ``lo..hi``; empty means ``default``."""
    text = raw.get(key, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise SimConfigError(f"{key}={text!r} is not an integer") from None
    if not lo <= value <= hi:
        raise SimConfigError(f"{key}={value} is outside {lo}..{hi}")
    return value


def _flag(raw: Mapping[str, str], key: str, default: bool) -> bool:
    """Return a 0/1 key as a bool."""
    return bool(_int(raw, key, int(default), 0, 1))


def _split_lines(text: str) -> tuple[dict[str, str], list[int]]:
    """Return ``KEY=VALUE`` pairs and the numbers of lines that are neither pair nor comment."""
    raw: dict[str, str] = {}
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            bad.append(number)
            continue
        raw[key.strip()] = value.strip()
    return raw, bad


def _cmd_port(raw: Mapping[str, str]) -> int | None:
    """Return ``IMEX_CMD_PORT`` or ``None`` when empty."""
    if raw.get("IMEX_CMD_PORT", "") == "":
        return None
    return _int(raw, "IMEX_CMD_PORT", 0, 1, 65535)


def _quorum(raw: Mapping[str, str]) -> str:
    """Return ``IMEX_WAIT_FOR_QUORUM`` checked against NONE/RECOVERY/FULL."""
    value = raw.get("IMEX_WAIT_FOR_QUORUM", "") or "RECOVERY"
    if value not in _QUORUM:
        raise SimConfigError(f"IMEX_WAIT_FOR_QUORUM={value!r} is not one of {', '.join(_QUORUM)}")
    return value


def _auth_mode(raw: Mapping[str, str]) -> str:
    """The authentication mode, refused where the shipped file's comments say initialization fails.

    "An empty or unexpected value will prevent initialization": for
    ``IMEX_AUTH_ENCRYPTION_MODE`` when authentication is on, and for
    ``IMEX_AUTH_SOURCE`` when the mode is ``SSL_TLS`` (design.md source imex-auth).
    """
    if not _flag(raw, "IMEX_ENABLE_AUTH_ENCRYPTION", False):
        return ""
    mode = raw.get("IMEX_AUTH_ENCRYPTION_MODE", "")
    if mode not in _AUTH_MODES:
        raise SimConfigError(f"IMEX_AUTH_ENCRYPTION_MODE={mode!r} is not one of {', '.join(_AUTH_MODES)}")
    source = raw.get("IMEX_AUTH_SOURCE", "")
    if mode == "SSL_TLS" and source not in _AUTH_SOURCES:
        raise SimConfigError(f"IMEX_AUTH_SOURCE={source!r} is not one of {', '.join(_AUTH_SOURCES)}")
    return mode


def parse_config_text(text: str, path: str = "<config>") -> SimConfig:
    """Parse ``config.cfg`` text.

    Values are taken verbatim after ``=`` (no trailing-comment stripping,
    design.md source imex-config); unknown keys and malformed lines are recorded for the
    daemon to log and otherwise ignored.

    Raises:
        SimConfigError: a value the simulator acts on is invalid.
    """
    raw, bad = _split_lines(text)
    port = _int(raw, "SERVER_PORT", 50000, 0, 65535)
    return SimConfig(
        path=path,
        log_level=_int(raw, "LOG_LEVEL", 4, 0, 5),
        log_file_name=raw.get("LOG_FILE_NAME", "/var/log/nvidia-imex.log"),
        log_append=_flag(raw, "LOG_APPEND_TO_LOG", True),
        daemonize=_flag(raw, "DAEMONIZE", True),
        bind_interface_ip=raw.get("BIND_INTERFACE_IP", ""),
        server_port=port,
        node_config_file=raw.get("IMEX_NODE_CONFIG_FILE", "") or "/etc/nvidia-imex/nodes_config.cfg",
        wait_for_quorum=_quorum(raw),
        cmd_enabled=_flag(raw, "IMEX_CMD_ENABLED", False),
        cmd_bind_ip=raw.get("IMEX_CMD_BIND_INTERFACE_IP", ""),
        cmd_port=_cmd_port(raw),
        cmd_unix_path=raw.get("IMEX_CMD_UNIX_DOMAIN_PATH", ""),
        grace_time_s=float(_int(raw, "IMEX_NODE_DISCONNECTED_GRACE_TIME", -1, -1, 2**31)),
        auth_mode=_auth_mode(raw),
        unknown_keys=tuple(sorted(k for k in raw if k not in KNOWN_KEYS)),
        bad_lines=tuple(bad),
    )


def load_config(path: str) -> SimConfig:
    """Read and parse a config file.

    Raises:
        OSError: the file cannot be read.
        SimConfigError: see :func:`parse_config_text`.
    """
    with open(path, encoding="utf-8") as fh:
        return parse_config_text(fh.read(), path)


def parse_nodes_text(text: str) -> tuple[str, ...]:
    """Return the nodes-file entries in order (line index = node ID).

    One address or host name per line; a final newline is fine.  Blank lines,
    comment lines and lines with inner whitespace are refused, because their
    meaning is not confirmed (design.md source imex-nodes) and they would shift node IDs.

    Raises:
        SimConfigError: the file is empty or has such a line.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise SimConfigError("node configuration file has no entries")
    for number, line in enumerate(lines, start=1):
        entry = line.strip()
        if not entry or entry.startswith("#") or len(entry.split()) != 1:
            raise SimConfigError(f"invalid entry {line!r} on line {number} of the node configuration file")
    return tuple(line.strip() for line in lines)


def read_nodes_file(path: str) -> tuple[str, ...]:
    """Read the nodes file.

    Raises:
        OSError: it cannot be read.
        SimConfigError: see :func:`parse_nodes_text`.
    """
    with open(path, encoding="utf-8") as fh:
        return parse_nodes_text(fh.read())


def node_map_key(entries: tuple[str, ...]) -> str:
    """Return the key two daemons compare to agree they share one node map."""
    import hashlib  # the daemon's alone: the ctl does not pay for OpenSSL's start-up

    normalized = "\n".join(e.strip().lower() for e in entries)
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]
