"""``nvidia-imex-sim``: a simulated ``nvidia-imex`` daemon for tests without IMEX hardware.

``nvidia-imex-sim -c <config.cfg> [-p|--port PORT] [--nogpu]``

Start-up reads the config and nodes file, finds its own node ID, checks the
fault switches and binds every socket *before* it daemonizes, so that with
``DAEMONIZE=1`` the parent can exit 0 only once the child serves (what
systemd ``Type=forking`` expects) and non-zero when anything failed.
Behaviour and every choice the reference leaves open: imexctl/sim/README.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import socket
import stat
import sys
from collections.abc import Iterable, Sequence
from typing import Callable, Final

from imexctl.sim.config import DEFAULT_CONFIG, SimConfig, SimConfigError, load_config, node_map_key, read_nodes_file
from imexctl.sim.faults import FaultError, Faults, parse_faults
from imexctl.sim.logfile import SimLog
from imexctl.sim.runtime import Identity, Node, Sockets

__all__ = ["DEFAULT_VERSION", "main"]

DEFAULT_VERSION: Final = "580.95.05"
USAGE: Final = "Usage: nvidia-imex-sim [-c <nvidia-imex config path>] [-p|--port <port>] [--nogpu]\n"


class _UsageError(Exception):
    """The command line is wrong."""


class StartupError(Exception):
    """Initialization failed; the message is what gets logged."""


@dataclasses.dataclass
class _Options:
    config: str = DEFAULT_CONFIG
    port: int | None = None
    nogpu: bool = False
    help: bool = False


def _parse_args(argv: Sequence[str]) -> _Options:
    """Parse ``-c``, ``-p/--port``, ``--nogpu``, ``-h/--help``."""
    opts, args = _Options(), list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            opts.help = True
        elif arg == "--nogpu":
            opts.nogpu = True
        elif arg in ("-c", "-p", "--port"):
            if not args:
                raise _UsageError(f"option {arg} needs a value")
            value = args.pop(0)
            if arg == "-c":
                opts.config = value
            elif not value.isdigit() or not 0 < int(value) < 65536:
                raise _UsageError(f"invalid port {value!r}")
            else:
                opts.port = int(value)
        else:
            raise _UsageError(f"unknown option {arg!r}")
    return opts


def _close_inherited_fds() -> None:
    """Close every inherited descriptor above stderr (a Slurm prolog may leak some)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass


def _echo_config(cfg: SimConfig, version: str, log: SimLog) -> None:
    """Log the configuration the way the real daemon does at start (design.md source imex-log)."""
    log.info(f"IMEX version {version} is running with the following configuration options")
    log.info(f"Logging level = {cfg.log_level}")
    log.info(f"Logging file name/path = {cfg.log_file_name}")
    log.info(f"Append to log file = {int(cfg.log_append)}")
    log.info(f"IMEX Library communication bind interface = {cfg.bind_interface_ip}")
    log.info(f"IMEX library communication bind port = {cfg.server_port}")
    log.info(f"Node configuration file = {cfg.node_config_file}")
    log.info(f"Wait for quorum = {cfg.wait_for_quorum}")
    if cfg.auth_mode:
        # sim only: the real daemon would authenticate and encrypt; the simulator's links stay plain TCP
        log.warning(f"Authentication mode {cfg.auth_mode} is accepted but not simulated: peer links are plain TCP")
    for key in cfg.unknown_keys:
        log.warning(f"Ignoring unknown configuration key {key}")
    for number in cfg.bad_lines:
        log.warning(f"Ignoring malformed line {number} of {cfg.path}")


def _resolve(entry: str, log: SimLog) -> str:
    """Return the address of a nodes-file entry; ``""`` if a host name does not resolve."""
    try:
        return str(ipaddress.ip_address(entry))
    except ValueError:
        pass
    log.info(f"Treating node config entry '{entry}' as a host name.")
    try:
        return str(socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except OSError as exc:
        log.warning(f"Unable to resolve node config entry '{entry}': {exc}")
        return ""


def _local_addresses() -> dict[str, str]:
    """Return ``{address: interface}``; ``IMEX_SIM_LOCAL_ADDRS`` (comma list) replaces the real list."""
    override = os.environ.get("IMEX_SIM_LOCAL_ADDRS", "")
    if override.strip():
        return {a.strip(): "sim0" for a in override.split(",") if a.strip()}
    import psutil

    out: dict[str, str] = {}
    for ifname, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                out.setdefault(addr.address.split("%")[0], ifname)
    return out


def _identify(entries: Sequence[str], addresses: Sequence[str], bind_ip: str) -> tuple[int, str]:
    """Return ``(own node ID, interface name)`` (design.md source imex-nodes)."""
    local = _local_addresses()
    if bind_ip:
        for node_id, pair in enumerate(zip(entries, addresses)):
            if bind_ip in pair:
                return node_id, local.get(bind_ip, "lo" if ipaddress.ip_address(bind_ip).is_loopback else "unknown")
        raise StartupError(f"BIND_INTERFACE_IP '{bind_ip}' does not match any entry of the node configuration file")
    for node_id, addr in enumerate(addresses):
        if addr and addr in local:
            return node_id, local[addr]
    raise StartupError("No matching network interface found for any IP addresses in the node configuration file")


def _read_nodes(cfg: SimConfig) -> tuple[str, ...]:
    """Read the nodes file or raise :class:`StartupError`."""
    try:
        return read_nodes_file(cfg.node_config_file)
    except OSError as exc:
        raise StartupError(f"Failed to read node configuration file {cfg.node_config_file}: {exc.strerror}") from None
    except SimConfigError as exc:
        raise StartupError(f"Failed to read node configuration file {cfg.node_config_file}: {exc}") from None


def _faults(own: Iterable[str]) -> Faults:
    """Read ``IMEX_SIM_FAULTS`` and the file named by ``IMEX_SIM_FAULTS_FILE`` from the environment.

    Faults reach the simulator only through its environment, set by whoever
    launches it (a test harness, the demo's launcher), never through the
    config file: that file belongs to imexctl, as on a real tray.
    """
    texts = [os.environ.get("IMEX_SIM_FAULTS", "")]
    path = os.environ.get("IMEX_SIM_FAULTS_FILE", "")
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                texts.append(fh.read())
        except OSError as exc:
            raise StartupError(f"Failed to read IMEX_SIM_FAULTS_FILE {path}: {exc.strerror}") from None
    try:
        return parse_faults(texts, own)
    except FaultError as exc:
        raise StartupError(f"Invalid simulator fault configuration: {exc}") from None


def _bind_tcp(host: str, port: int, what: str) -> socket.socket:
    """Bind and listen on ``host:port``; empty host = all interfaces."""
    try:
        if host:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return socket.create_server((host, port), family=family, backlog=128)
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
        return socket.create_server(("", port), backlog=128)
    except OSError as exc:
        raise StartupError(f"Failed to bind {what} to {host or '*'}:{port}: {exc.strerror}") from None


def _bind_unix(path: str) -> socket.socket:
    """Bind the command Unix socket; a stale socket file from a crash is replaced."""
    try:
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise StartupError(f"Failed to bind command service to {path}: exists and is not a socket")
            with socket.socket(socket.AF_UNIX) as probe:
                if probe.connect_ex(path) == 0:
                    raise StartupError(f"Failed to bind command service to {path}: Address already in use")
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(128)
        return sock
    except OSError as exc:
        raise StartupError(f"Failed to bind command service to {path}: {exc.strerror or exc}") from None


def _bind_all(cfg: SimConfig, own_ip: str, log: SimLog) -> Sockets:
    """Bind the peer port and the command endpoints."""
    socks = Sockets(peer=_bind_tcp(own_ip, cfg.server_port, "IMEX server"))
    if not cfg.cmd_enabled:
        return socks
    if cfg.cmd_port is None and not cfg.cmd_unix_path:
        log.warning("IMEX_CMD_ENABLED=1 but neither IMEX_CMD_PORT nor IMEX_CMD_UNIX_DOMAIN_PATH is set")
    if cfg.cmd_port is not None:
        socks.cmd_tcp = _bind_tcp(cfg.cmd_bind_ip, cfg.cmd_port, "command service")
    if cfg.cmd_unix_path:
        socks.cmd_unix = _bind_unix(cfg.cmd_unix_path)
        socks.unix_path = cfg.cmd_unix_path
    return socks


def _prepare(opts: _Options, cfg: SimConfig, log: SimLog) -> tuple[Identity, Faults, Sockets]:
    """Everything that can fail, before the daemon detaches."""
    _echo_config(cfg, "NO_GPU" if opts.nogpu else DEFAULT_VERSION, log)
    entries = _read_nodes(cfg)
    addresses = [_resolve(e, log) for e in entries]
    bind_ip = _resolve(cfg.bind_interface_ip, log) if cfg.bind_interface_ip else ""
    own_id, ifname = _identify(entries, addresses, bind_ip)
    own_ip = bind_ip or addresses[own_id]
    log.info(f"Identified this node as ID {own_id}, using bind IP of '{own_ip}', and network interface of {ifname}")
    faults = _faults({entries[own_id], own_ip})
    version = faults.version or ("NO_GPU" if opts.nogpu else DEFAULT_VERSION)
    log.info(
        "nvidia-imex persistence file /var/run/nvidia-imex/persist.dat does not exist.  Assuming no previous importers."
    )
    log.info(
        "Running without GPUs (--nogpu)" if opts.nogpu else "NvGpu Library version matched with GPU Driver version"
    )
    if faults.version:
        log.info(f"Simulated fault version: reporting version {version}")
    addresses[own_id] = own_ip
    hostname = faults.hostname or socket.gethostname()
    ident = Identity(tuple(entries), tuple(addresses), own_id, node_map_key(tuple(entries)), version, hostname)
    return ident, faults, _bind_all(cfg, own_ip, log)


def _serve(
    parts: tuple[Identity, Faults, Sockets], cfg: SimConfig, log: SimLog, on_ready: Callable[[], None] | None = None
) -> int:
    """Run the event loop until the daemon stops."""

    async def _main() -> int:
        ident, faults, socks = parts
        node = Node(ident, cfg, faults, log, socks)
        log.info("Started processing of incoming messages.")
        return await node.run(on_ready)

    return asyncio.run(_main())


def _detach_stdio() -> None:
    """Point stdin/stdout/stderr at /dev/null so no caller's pipe stays open."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _daemonize(parts: tuple[Identity, Faults, Sockets], cfg: SimConfig, log: SimLog) -> int:
    """Fork; the parent returns 0 once the child serves, 1 if it died first."""
    sys.stdout.flush()
    sys.stderr.flush()
    rfd, wfd = os.pipe()
    if os.fork():
        os.close(wfd)
        with os.fdopen(rfd, "rb") as pipe:
            return 0 if pipe.read() == b"ok" else 1
    os.close(rfd)
    os.setsid()
    os.chdir("/")

    def ready() -> None:
        os.write(wfd, b"ok")
        os.close(wfd)
        _detach_stdio()

    return _serve(parts, cfg, log, ready)


def _load(opts: _Options) -> SimConfig:
    """Load the config file or raise :class:`StartupError`."""
    try:
        cfg = load_config(opts.config)
    except OSError as exc:
        raise StartupError(f"Failed to read config file {opts.config}: {exc.strerror}") from None
    except SimConfigError as exc:
        raise StartupError(f"Invalid config file {opts.config}: {exc}") from None
    if opts.port is not None:
        cfg = cfg._replace(server_port=opts.port)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated daemon; meant to be a process of its own (it closes inherited fds)."""
    try:
        opts = _parse_args(sys.argv[1:] if argv is None else argv)
    except _UsageError as exc:
        sys.stderr.write(f"nvidia-imex-sim: {exc}\n{USAGE}")
        return 1
    if opts.help:
        sys.stdout.write(USAGE)
        return 0
    _close_inherited_fds()
    log: SimLog | None = None
    try:
        cfg = _load(opts)
        log = SimLog.open(cfg.log_file_name, cfg.log_level, cfg.log_append)
        parts = _prepare(opts, cfg, log)
    except StartupError as exc:
        if log is not None:
            log.error(str(exc))
        if log is None or log.stream is not sys.stderr:
            sys.stderr.write(f"nvidia-imex-sim: {exc}\n")
        return 1
    try:
        if cfg.daemonize:
            return _daemonize(parts, cfg, log)
        return _serve(parts, cfg, log)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
