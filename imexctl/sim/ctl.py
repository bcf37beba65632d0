"""``nvidia-imex-ctl-sim``: a simulated ``nvidia-imex-ctl`` for the simulated daemon.

``nvidia-imex-ctl-sim [-c <cfg> | -u <socket> | -i <ip> <port>] (-q | -N [-j] [-H]) [-t <ms>]``

Exit codes: 0 the daemon answered (any ``-q`` state), or ``-N`` printed a
domain (also the all-UNAVAILABLE one rebuilt from the nodes file when no
daemon answers); 1 no daemon answered ``-q`` (prints ``UNAVAILABLE``) or
``-N`` via ``-u``/``-i`` has nothing to show; 2 bad usage; 255 the config or
node configuration file cannot be read (imex.md §8.5).  Start-up stays cheap:
socket, json, sys, os and the two small sim modules, nothing else.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any, Final, Sequence, Tuple

from imexctl.sim.config import DEFAULT_CONFIG, SimConfigError, load_config, read_nodes_file
from imexctl.sim.formats import format_json, format_text, unavailable_snapshot

__all__ = ["CtlError", "Endpoint", "main", "request"]

USAGE: Final = (
    "Usage: nvidia-imex-ctl-sim [-i <IP> <PORT>|-u <unix domain socket path>|-c <nvidia-imex config.cfg path>] "
    "<-N|-q> [-j] [-H] [-t <timeout>]\n"
    "Where:\n"
    "       -c <nvidia-imex config path>: Path to nvidia-imex configuration file.  "
    "Default value is /etc/nvidia-imex/config.cfg\n"
    "NOTE:  If none of -i, -u, -c are provided, -c is assumed with default value.\n"
    "       -q: Query the status of the IMEX daemon once and return.\n"
    "       -N: Gets the full status of the entire IMEX domain.  Requires config file (default or via -c)\n"
    "       -H: Show hostname alongside node IP, only works with -N\n"
    "       -t: Timeout (in milliseconds) for a request.  Unspecified means it waits forever.\n"
    "       -j: Output of the -N command will be in JSON, rather than formatted.\n"
    "NOTE: only one of -i, -u, or -c can be specified\n"
)
EXIT_OK: Final = 0
EXIT_UNAVAILABLE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NO_CONFIG: Final = 255

#: ``("unix", path)`` or ``("tcp", host, port)``.
Endpoint = Tuple[Any, ...]


class CtlError(Exception):
    """No usable answer from the daemon; the message says why."""


class _NoConfig(Exception):
    """The config or nodes file cannot be read (exit 255)."""


class _UsageError(Exception):
    """The command line is wrong."""


class _Opts:
    """Parsed command line."""

    def __init__(self) -> None:
        self.config: str | None = None
        self.unix: str | None = None
        self.tcp: tuple[str, int] | None = None
        self.query = self.domain = self.json = self.hostnames = False
        self.timeout_s: float | None = None


def _tokens(argv: Sequence[str]) -> list[str]:
    """Split ``--u=path`` / ``-c=path`` forms (DRA calls ``-q --u=<socketPath>``) into two tokens."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("-") and "=" in arg:
            flag, _, value = arg.partition("=")
            out += ["-" + flag.lstrip("-"), value]
        else:
            out.append(arg)
    return out


def _take(args: list[str], flag: str) -> str:
    """Pop the value of ``flag``."""
    if not args:
        raise _UsageError(f"option {flag} needs a value")
    return args.pop(0)


def _apply(flag: str, args: list[str], o: _Opts) -> None:
    """Apply one option to ``o``."""
    if flag == "-c":
        o.config = _take(args, flag)
    elif flag == "-u":
        o.unix = _take(args, flag)
    elif flag == "-i":
        host, port = _take(args, flag), _take(args, flag)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise _UsageError(f"invalid port {port!r} for -i")
        o.tcp = (host, int(port))
    elif flag == "-t":
        value = _take(args, flag)
        if not value.isdigit():
            raise _UsageError(f"invalid timeout {value!r} for -t (milliseconds)")
        o.timeout_s = int(value) / 1000.0
    elif flag in ("-q", "-N", "-j", "-H"):
        attr = {"-q": "query", "-N": "domain", "-j": "json", "-H": "hostnames"}[flag]
        setattr(o, attr, True)
    elif flag in ("-n", "-s", "-d", "-m", "-a"):
        raise _UsageError(f"option {flag} is not supported by the simulator")
    else:
        raise _UsageError(f"unknown option {flag!r}")


def _parse(argv: Sequence[str]) -> _Opts:
    """Parse and check the command line."""
    o, args = _Opts(), _tokens(argv)
    while args:
        _apply(args.pop(0), args, o)
    if sum(x is not None for x in (o.config, o.unix, o.tcp)) > 1:
        raise _UsageError("only one of -i, -u, or -c can be specified")
    if o.query == o.domain:
        raise _UsageError("exactly one of -q or -N is required")
    if (o.json or o.hostnames) and not o.domain:
        raise _UsageError("-j and -H only work with -N")
    return o


def _connect(endpoint: Endpoint, timeout_s: float | None) -> socket.socket:
    """Open a connection to the command service."""
    if endpoint[0] == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(endpoint[1])
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((endpoint[1], endpoint[2]), timeout=timeout_s)


def _describe(endpoint: Endpoint) -> str:
    """Return an endpoint for messages."""
    return endpoint[1] if endpoint[0] == "unix" else f"{endpoint[1]}:{endpoint[2]}"


def request(endpoint: Endpoint, cmd: str, timeout_s: float | None = None) -> dict[str, Any]:
    """Send one request (``query`` or ``domain``) and return the daemon's JSON answer.

    Raises:
        CtlError: no daemon answered (refused, missing socket, timeout, garbage).
    """
    where = _describe(endpoint)
    try:
        with _connect(endpoint, timeout_s) as sock:
            sock.sendall(json.dumps({"cmd": cmd}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except socket.timeout:
        raise CtlError(f"timed out after {timeout_s or 0:g} s waiting for the IMEX daemon at {where}") from None
    except OSError as exc:
        raise CtlError(f"cannot connect to the IMEX daemon at {where}: {exc.strerror or exc}") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise CtlError(f"unreadable answer from the IMEX daemon at {where}: {data[:200]!r}") from None
    if not isinstance(answer, dict) or "error" in answer:
        raise CtlError(f"IMEX daemon at {where} refused the request: {answer!r}")
    return answer


def _from_config(path: str) -> tuple[Endpoint | None, tuple[str, ...]]:
    """Return the command endpoint named by a config file and its nodes-file entries.

    Raises:
        _NoConfig: either file cannot be read (the caller exits 255).
    """
    try:
        cfg = load_config(path)
    except (OSError, SimConfigError):
        raise _NoConfig(f"Failed to read config file {path}") from None
    try:
        entries = read_nodes_file(cfg.node_config_file)
    except (OSError, SimConfigError):
        raise _NoConfig(f"Failed to read node configuration file {cfg.node_config_file}") from None
    if not cfg.cmd_enabled:
        return None, entries
    if cfg.cmd_unix_path:
        return ("unix", cfg.cmd_unix_path), entries
    if cfg.cmd_port is not None:
        host = cfg.cmd_bind_ip if cfg.cmd_bind_ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return ("tcp", host, cfg.cmd_port), entries
    return None, entries


def _ask(endpoint: Endpoint | None, cmd: str, timeout_s: float | None) -> dict[str, Any]:
    """Like :func:`request`, with ``None`` meaning the command service is disabled."""
    if endpoint is None:
        raise CtlError("the command service is not enabled in the config (IMEX_CMD_ENABLED)")
    return request(endpoint, cmd, timeout_s)


def _run_query(endpoint: Endpoint | None, o: _Opts) -> int:
    """``-q``: print one state word."""
    try:
        state = str(_ask(endpoint, "query", o.timeout_s)["state"])
    except (CtlError, KeyError) as exc:
        sys.stderr.write(f"nvidia-imex-ctl-sim: {exc}\n")
        sys.stdout.write("UNAVAILABLE\n")
        return EXIT_UNAVAILABLE
    sys.stdout.write(state + "\n")
    return EXIT_OK


def _run_domain(endpoint: Endpoint | None, entries: tuple[str, ...] | None, o: _Opts) -> int:
    """``-N``: print the domain, rebuilt from the nodes file when no daemon answers."""
    try:
        snapshot = _ask(endpoint, "domain", o.timeout_s)["snapshot"]
    except (CtlError, KeyError) as exc:
        sys.stderr.write(f"nvidia-imex-ctl-sim: {exc}\n")
        if entries is None:
            return EXIT_UNAVAILABLE
        snapshot = unavailable_snapshot(entries)
    render = format_json if o.json else format_text
    sys.stdout.write(render(snapshot, hostnames=o.hostnames))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated ctl; returns the exit code."""
    try:
        o = _parse(sys.argv[1:] if argv is None else argv)
    except _UsageError as exc:
        sys.stderr.write(f"nvidia-imex-ctl-sim: {exc}\n{USAGE}")
        return EXIT_USAGE
    endpoint: Endpoint | None
    entries: tuple[str, ...] | None = None
    if o.unix is not None:
        endpoint = ("unix", o.unix)
    elif o.tcp is not None:
        endpoint = ("tcp", *o.tcp)
    else:
        try:
            endpoint, entries = _from_config(o.config or DEFAULT_CONFIG)
        except _NoConfig as exc:
            sys.stdout.write(f"{exc}\n")
            return EXIT_NO_CONFIG
    if o.query:
        return _run_query(endpoint, o)
    return _run_domain(endpoint, entries, o)


if __name__ == "__main__":
    sys.exit(main())
