"""``nvidia-imex-ctl-sim``: a simulated ``nvidia-imex-ctl`` for the simulated daemon.

``nvidia-imex-ctl-sim [-c <cfg> | -u <socket> | -i <ip> <port>] (-q | -N [-j] [-H]) [-t <ms>]``

``-q`` asks one daemon: the endpoint named by the config (``-c``), a Unix
socket (``-u``) or ``-i <ip> <port>``.  ``-N`` needs the config: it reads the
nodes file and ``IMEX_CMD_PORT`` and asks *every* node's command service,
at ``<nodes-file entry>:<IMEX_CMD_PORT>``, for that node's own state and
row, in parallel, as the real ctl does (kubernetes-sigs/dra-driver-nvidia-gpu
PR #540: ``-N`` "tries to reach not just the local daemon, but all other
daemons").  A node that cannot be reached shows ``UNAVAILABLE`` with every
link ``I``.  Connections leave from the config's command bind address when it
names one, as a tray's own connections do on a real network.

Exit codes: 0 the daemon answered (any ``-q`` state), or ``-N`` printed a
domain (also one where no node answered); 1 no daemon answered ``-q``
(prints ``UNAVAILABLE``); 2 bad usage; 255 the config or node configuration
file cannot be read (design.md source ctl-unavailable).  Start-up stays cheap: socket, json,
sys and the small sim modules, nothing else (threading only for ``-N``; no
``concurrent.futures``, ``dataclasses`` or ``hashlib``): a readiness probe
starts this program once per call, and its start-up is most of the probe
(docs/performance.md).
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Sequence
from typing import Any, Callable, Final, TypeVar

from imexctl.sim.config import DEFAULT_CONFIG, SimConfig, SimConfigError, load_config, read_nodes_file
from imexctl.sim.formats import assemble_snapshot, format_json, format_text

__all__ = ["CtlError", "Endpoint", "ask_node", "gather", "main", "request"]

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

_T = TypeVar("_T")

#: ``("unix", path)`` or ``("tcp", host, port)``.
Endpoint = tuple[Any, ...]


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
    if o.domain and (o.unix is not None or o.tcp is not None):
        raise _UsageError("-N requires the config file (default or via -c), not -i or -u")
    return o


def _connect(endpoint: Endpoint, timeout_s: float | None, source: str = "") -> socket.socket:
    """Open a connection to a command service, from ``source`` when given."""
    if endpoint[0] == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(endpoint[1])
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection(
        (endpoint[1], endpoint[2]), timeout=timeout_s, source_address=(source, 0) if source else None
    )


def _describe(endpoint: Endpoint) -> str:
    """Return an endpoint for messages."""
    return endpoint[1] if endpoint[0] == "unix" else f"{endpoint[1]}:{endpoint[2]}"


def request(endpoint: Endpoint, cmd: str, timeout_s: float | None = None, source: str = "") -> dict[str, Any]:
    """Send one request (``query`` or ``node``) and return the daemon's JSON answer.

    Raises:
        CtlError: no daemon answered (refused, reset, missing socket, timeout, garbage).
    """
    where = _describe(endpoint)
    try:
        with _connect(endpoint, timeout_s, source) as sock:
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
        raise CtlError(f"cannot reach the IMEX daemon at {where}: {exc.strerror or exc}") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise CtlError(f"no answer from the IMEX daemon at {where}: {data[:200]!r}") from None
    if not isinstance(answer, dict) or "error" in answer:
        raise CtlError(f"IMEX daemon at {where} refused the request: {answer!r}")
    return answer


def _load(path: str) -> tuple[SimConfig, tuple[str, ...]]:
    """Return a config file and its nodes-file entries.

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
    return cfg, entries


def _source(cfg: SimConfig) -> str:
    """The address a tray's own connections leave from: the command bind IP when it names one."""
    return "" if cfg.cmd_bind_ip in ("", "0.0.0.0", "::") else cfg.cmd_bind_ip


def _local_endpoint(cfg: SimConfig) -> Endpoint | None:
    """The local daemon's command endpoint named by the config (``-q`` with ``-c``)."""
    if not cfg.cmd_enabled:
        return None
    if cfg.cmd_unix_path:
        return ("unix", cfg.cmd_unix_path)
    if cfg.cmd_port is not None:
        return ("tcp", _source(cfg) or "127.0.0.1", cfg.cmd_port)
    return None


def _query(endpoint: Endpoint | None, timeout_s: float | None, source: str) -> dict[str, Any]:
    if endpoint is None:
        raise CtlError("the command service is not enabled in the config (IMEX_CMD_ENABLED, IMEX_CMD_PORT)")
    return request(endpoint, "query", timeout_s, source)


def _run_query(endpoint: Endpoint | None, o: _Opts, source: str = "") -> int:
    """``-q``: print one state word."""
    try:
        state = str(_query(endpoint, o.timeout_s, source)["state"])
    except (CtlError, KeyError) as exc:
        sys.stderr.write(f"nvidia-imex-ctl-sim: {exc}\n")
        sys.stdout.write("UNAVAILABLE\n")
        return EXIT_UNAVAILABLE
    sys.stdout.write(state + "\n")
    return EXIT_OK


def ask_node(entry: str, cfg: SimConfig, timeout_s: float | None) -> dict[str, Any]:
    """One node's own answer (state, version, hostname, row) from its service at ``entry:IMEX_CMD_PORT``.

    Raises:
        CtlError: that node's command service cannot be reached or answers garbage.
    """
    if not cfg.cmd_enabled or cfg.cmd_port is None:
        raise CtlError("no IMEX_CMD_PORT in the config: peers' command services cannot be reached")
    try:
        answer = request(("tcp", entry, cfg.cmd_port), "node", timeout_s, _source(cfg))["node"]
    except KeyError:
        answer = None
    if not isinstance(answer, dict):
        raise CtlError(f"unexpected answer from {entry}:{cfg.cmd_port}: {answer!r}")
    return answer


def gather(
    cfg: SimConfig, entries: Sequence[str], timeout_s: float | None, warn: Callable[[str], object] = lambda _msg: None
) -> dict[str, Any]:
    """The ``-N`` snapshot: every node's service asked in parallel; ``warn`` hears who did not answer."""

    def one(entry: str) -> dict[str, Any] | None:
        try:
            return ask_node(entry, cfg, timeout_s)
        except CtlError as exc:
            warn(f"node {entry}: {exc}")
            return None

    answers = _in_parallel(one, list(entries), workers=64)
    source = _source(cfg)
    return assemble_snapshot(entries, answers, list(entries).index(source) if source in entries else None)


def _in_parallel(fn: Callable[[str], _T], items: list[str], *, workers: int) -> list[_T]:
    """``[fn(x) for x in items]``, run by up to ``workers`` threads; the first exception is raised here.

    Plain threads rather than ``concurrent.futures``: that package imports
    ``logging``, about 10 ms of the ctl's start-up, paid by every probe.
    """
    import threading

    results: dict[int, _T] = {}
    errors: list[BaseException] = []
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while not errors:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller's thread below
                errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, max(1, len(items))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(items))]


def _run_domain(cfg: SimConfig, entries: tuple[str, ...], o: _Opts) -> int:
    """``-N``: ask every node's command service in parallel and print the domain."""
    snapshot = gather(cfg, entries, o.timeout_s, lambda msg: sys.stderr.write(f"nvidia-imex-ctl-sim: {msg}\n"))
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
    if o.unix is not None:
        return _run_query(("unix", o.unix), o)
    if o.tcp is not None:
        return _run_query(("tcp", *o.tcp), o)
    try:
        cfg, entries = _load(o.config or DEFAULT_CONFIG)
    except _NoConfig as exc:
        sys.stdout.write(f"{exc}\n")
        return EXIT_NO_CONFIG
    if o.query:
        return _run_query(_local_endpoint(cfg), o, _source(cfg))
    return _run_domain(cfg, entries, o)


if __name__ == "__main__":
    sys.exit(main())
