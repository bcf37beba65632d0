"""``imexctl netcheck``: prove that both per-job port ranges are open between the trays, before the first job.

Run as one job step with one task per tray (``srun -N18 --ntasks-per-node=1
imexctl netcheck``), as any user: no root, GPU or IMEX needed.  Every tray
listens on one port of ``[ports] server_port_range`` and one of
``cmd_port_range`` at its address (resolved by ``[resolve] method``, as the
prolog resolves it), connects to every other tray's two ports from that
address, and reports what it reached.

No coordinator: every tray computes every tray's ports from the step alone.
Tray ``i`` (its index in the step's node list) tries, in order, the
:data:`WINDOW` candidates ``LOW + (job_id + size // 2 + i + k * n) % size`` (``n``
trays, ``k = 0, 1, ...``; half a range from the job's own IMEX port and those of
the jobs after it) and listens on the first it can bind; peers try the same
candidates in the same order, so a port another program holds only moves the
listener to the next one.  A listener greets with a banner naming the job,
the tray and the range, so a port that some other program answers is not
taken for open.  Peers retry for ``timeout_s`` (srun starts the tasks at
slightly different times).  A listener serves every connection at once, each
within its own deadline (:attr:`Plan.line_timeout_s` for the banner and the
line together, however slowly the bytes come), so a client that sends a byte
a second, or nothing, neither delays the peers nor holds the listener (issue
41); a peer gives a port that greets too slowly up by the same deadline.  A tray keeps listening until every peer has
reached both its ports (or, after a blocked pair, until twice ``timeout_s``).
Each tray then sends its row to the step's first tray, which prints the
tray-by-tray matrix; every tray prints its own line and exits 1 when
anything it checked was blocked, so srun's exit code is non-zero then too.

Anybody who can reach a listener can send it lines (issue 33: a forged row
made a tray that never ran look reachable, its text reached the terminal
raw, and a malformed row crashed the report with exit 70).  So a tray's
``HELLO`` and ``ROW`` count only when they come from that tray's planned
address, a row must be exactly the shape a tray sends (known trays and
ranges, short strings), and every text from the network is printed escaped.
What was ignored, and from where, is printed too.  A user on a tray can
still speak for that tray, from its address: the report is as trustworthy as
the trays' users.
"""

from __future__ import annotations

import dataclasses
import json
import selectors
import socket
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import tenacity

from imexctl import slurm as var

if TYPE_CHECKING:
    import argparse

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject

__all__ = [
    "BANNER",
    "WINDOW",
    "Plan",
    "Report",
    "Tray",
    "candidates",
    "command",
    "parse_row",
    "plan_from_env",
    "render_matrix",
    "run",
    "shown",
]

BANNER: Final = "IMEXCTL-NETCHECK 1"
#: candidate ports per tray and range
WINDOW: Final = 4
#: one connection attempt; a dropped SYN (a firewall) costs this much
_CONNECT_TIMEOUT_S: Final = 1.0
#: a connection's banner and line must both come within this, in all (the default of ``Plan.line_timeout_s``)
_LINE_TIMEOUT_S: Final = 2.0
#: the longest line a listener takes (a tray's row names every other tray: some 40 KiB for 72 trays)
_MAX_LINE: Final = 65536
#: connections a listener serves at once (two per peer at most); more wait in the kernel's accept queue
_MAX_CONNECTIONS: Final = 512
_RETRY_PAUSE_S: Final = 0.2
#: the longest outcome text a row may carry per tray and range (a tray's own are under 200 characters)
_MAX_OUTCOME: Final = 512
#: lines ignored that the report names (the rest are counted)
_MAX_IGNORED: Final = 5


@dataclasses.dataclass(frozen=True)
class Tray:
    """One tray of the step: its Slurm name and the address its IMEX daemons would use."""

    name: str
    address: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every tray of the step computes alike."""

    job_id: int
    me: int
    trays: tuple[Tray, ...]
    #: ``(label, low, high)``: ``("server", 61000, 61999)``, ``("cmd", 62000, 62999)``
    ranges: tuple[tuple[str, int, int], ...]
    timeout_s: float
    #: one connection's whole exchange, the listener's banner and the client's line, within this (seconds)
    line_timeout_s: float = _LINE_TIMEOUT_S

    def ports(self, index: int, label: str) -> list[int]:
        """Tray ``index``'s candidate ports in range ``label``, in the order they are tried."""
        _, lo, hi = next(r for r in self.ranges if r[0] == label)
        return candidates(self.job_id, index, len(self.trays), lo, hi)

    @property
    def own(self) -> Tray:
        """This tray."""
        return self.trays[self.me]


def candidates(job_id: int, index: int, trays: int, low: int, high: int) -> list[int]:
    """``LOW + (job_id + size // 2 + index + k * trays) % size`` for ``k`` below :data:`WINDOW`: distinct ports.

    Half a range away from ``LOW + job_id % size``, the port of the IMEX
    domain that imexctl's prolog may have started for the very job that runs
    netcheck, and from the ports of the jobs that start right after it (job
    ``J + 1`` takes ``LOW + (J + 1) % size``: seen in the lab, a prolog of the
    next job found its port still bound by netcheck's listener and refused
    the tray).  In a range too small for that, the ports after the first fill
    the window.
    """
    size = high - low + 1
    out = dict.fromkeys(low + (job_id + size // 2 + index + k * trays) % size for k in range(WINDOW))
    port = next(iter(out))
    while len(out) < min(WINDOW, size):  # a small range the stride keeps revisiting: the next ports instead
        port = low + (port - low + 1) % size
        out.setdefault(port)
    return list(out)


def plan_from_env(env: Mapping[str, str], settings: Any, host: Any, timeout_s: float) -> Plan:
    """The step's trays and addresses from srun's environment, resolved as the prolog resolves them.

    Raises:
        EnvironmentError_: not inside a job step (no job id, node name or node list), or this node not in it.
        ResolveError, ConfigError: as the prolog's resolution.
    """
    from imexctl.hooks import members
    from imexctl.platform.errors import EnvironmentError_
    from imexctl.slurm import job as slurm
    from imexctl.slurm import nodelist

    job_id, node = var.value(env, var.JOB_ID), slurm.node_name(env)
    listed = var.value(env, var.STEP_NODELIST)  # else the job's (table: its fallbacks)
    if not job_id.isdigit() or not node or not listed:
        raise EnvironmentError_(
            "netcheck runs as a job step on the trays: srun -N<trays> --ntasks-per-node=1 imexctl netcheck "
            "(it needs SLURM_JOB_ID, SLURMD_NODENAME and SLURM_STEP_NODELIST from srun)"
        )
    names = tuple(nodelist.expand(listed))
    if node not in names:
        raise EnvironmentError_(f"this node {node} is not in the step's node list {listed}")
    table = None
    if settings.resolve.method == "slurm_conf":
        from imexctl.slurm import nodeaddr

        table = nodeaddr.read(nodeaddr.conf_path(var.value(env, var.CONF), settings.paths.root))
    addrs = members.resolve_all(
        names, method=settings.resolve.method, host=host, hosts_file=settings.paths.hosts_file, node_addrs=table
    )
    members.check_own(node, addrs[names.index(node)], settings.resolve.method, host)
    p = settings.ports
    ranges = (("server", *p.server_port_range), ("cmd", *p.cmd_port_range))
    trays = tuple(Tray(n, a) for n, a in zip(names, addrs))
    return Plan(int(job_id), names.index(node), trays, ranges, timeout_s)


@dataclasses.dataclass
class _Conn:
    """One connection a listener serves: its range, the peer's address, its deadline, the banner and the bytes."""

    sock: socket.socket
    label: str
    peer: str
    deadline: float
    out: bytes
    data: bytearray = dataclasses.field(default_factory=bytearray)


class _Listener:
    """This tray's two listening sockets, served by one thread: banner, then a HELLO or a ROW line."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.socks: dict[str, socket.socket] = {}
        self.ports: dict[str, int] = {}
        self.problems: dict[str, str] = {}
        self.reached_by: dict[str, set[str]] = {label: set() for label, _, _ in plan.ranges}
        self.rows: dict[str, dict[str, Any]] = {}
        #: the first lines refused: (peer address, why), for the report; and how many in all
        self.ignored: list[tuple[str, str]] = []
        self.ignored_count = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        #: the connections being served, by socket (the serving thread's alone)
        self._conns: dict[socket.socket, _Conn] = {}
        self._accepting = True

    def open(self) -> None:
        """Bind the first free candidate of each range; a range with none is a problem of this tray."""
        for label, _, _ in self.plan.ranges:
            tried = []
            for port in self.plan.ports(self.plan.me, label):
                family = socket.AF_INET6 if ":" in self.plan.own.address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                # SO_REUSEADDR: the connections it accepted and closed first wait in TIME_WAIT for a minute;
                # with the option they do not block a later job's daemon (or prolog) from binding the port
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((self.plan.own.address, port))
                    sock.listen(64)
                except OSError as exc:
                    sock.close()
                    tried.append(f"{port} ({exc.strerror or exc})")
                    continue
                self.socks[label], self.ports[label] = sock, port
                break
            else:
                self.problems[label] = f"cannot listen on {self.plan.own.address}: " + ", ".join(tried)

    def serve(self) -> None:
        """Answer connections until :attr:`stop` is set: all of them at once, each within its own deadline.

        One thread and a selector, not a thread per connection: anybody who can
        reach the port can open connections, and here each costs a socket and
        its bytes, never a thread, so a silent or trickling client holds
        nothing that a peer needs.  Each connection has one deadline for the
        banner and the line together (:attr:`Plan.line_timeout_s`), however
        its bytes come; at most :data:`_MAX_CONNECTIONS` are served at once,
        and the rest wait in the kernel's accept queue until one ends.
        """
        with selectors.DefaultSelector() as sel:
            for label, sock in self.socks.items():
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ, label)
            while not self.stop.is_set():
                for key, events in sel.select(self._pause()):
                    if isinstance(key.data, _Conn):
                        self._step(sel, key.data, events)
                    elif self._accepting:  # not when the limit was reached by a connection of this round
                        self._accept(sel, key.fileobj, key.data)  # type: ignore[arg-type]
                self._expire(sel)
            for conn in list(self._conns.values()):  # the step is over: whoever is still connected is let go
                self._close(sel, conn)
        for sock in self.socks.values():
            sock.close()

    def _pause(self) -> float:
        """How long the selector may wait: until the next deadline, and 50 ms at most (to see :attr:`stop`)."""
        soonest = min((c.deadline for c in self._conns.values()), default=float("inf"))
        return max(0.0, min(0.05, soonest - time.monotonic()))

    def _accept(self, sel: selectors.BaseSelector, listening: socket.socket, label: str) -> None:
        """Take one connection: its deadline starts now; its banner goes out as the socket takes it."""
        try:
            sock, addr = listening.accept()
        except OSError:
            return
        sock.setblocking(False)
        banner = f"{BANNER} {self.plan.job_id} {self.plan.own.name} {label}\n".encode()
        conn = _Conn(sock, label, str(addr[0]), time.monotonic() + self.plan.line_timeout_s, banner)
        self._conns[sock] = conn
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        if len(self._conns) >= _MAX_CONNECTIONS:
            self._listen(sel, False)

    def _step(self, sel: selectors.BaseSelector, conn: _Conn, events: int) -> None:
        """Send what the banner has left, read what came; answer a whole line (or what came before the end)."""
        try:
            if events & selectors.EVENT_WRITE and conn.out:
                conn.out = conn.out[conn.sock.send(conn.out) :]
                if not conn.out:
                    sel.modify(conn.sock, selectors.EVENT_READ, conn)
            if not events & selectors.EVENT_READ:
                return
            chunk = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:  # reset by the peer
            self._close(sel, conn)
            return
        conn.data += chunk
        if chunk and b"\n" not in conn.data and len(conn.data) <= _MAX_LINE:
            return  # more to come
        self._close(sel, conn)
        if len(conn.data.split(b"\n", 1)[0]) > _MAX_LINE:
            with self.lock:
                self._ignore(conn.peer, f"a line longer than {_MAX_LINE} bytes")
            return
        line = conn.data.split(b"\n", 1)[0].decode(errors="replace").strip()
        self._answer(line, conn.label, conn.peer)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        """End every connection whose deadline passed without a whole line, and name it in the report."""
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._close(sel, conn)
            with self.lock:
                self._ignore(conn.peer, f"no whole line within {self.plan.line_timeout_s:g} s ({len(conn.data)} bytes)")

    def _close(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """Forget and close one connection; take new ones again below the limit."""
        sel.unregister(conn.sock)
        conn.sock.close()
        del self._conns[conn.sock]
        if not self._accepting and len(self._conns) < _MAX_CONNECTIONS:
            self._listen(sel, True)

    def _listen(self, sel: selectors.BaseSelector, on: bool) -> None:
        """Watch the listening sockets for new connections (``on``), or leave them in the kernel's queue."""
        if on == self._accepting:
            return
        self._accepting = on
        for label, sock in self.socks.items():
            if on:
                sel.register(sock, selectors.EVENT_READ, label)
            else:
                sel.unregister(sock)

    def _answer(self, line: str, label: str, peer: str) -> None:
        """Take a peer's ``HELLO`` or ``ROW`` line, or name what else came."""
        kind, _, rest = line.partition(" ")
        if kind == "HELLO":
            why = self._sender(rest, peer)
            with self.lock:
                if why:
                    self._ignore(peer, f"HELLO: {why}")
                else:
                    self.reached_by[label].add(rest)
        elif kind == "ROW":
            row, why = parse_row(self.plan, rest)
            why = why or self._sender(str(row.get("from", "")), peer)
            with self.lock:
                if why:
                    self._ignore(peer, f"ROW: {why}")
                else:
                    self.rows[str(row["from"])] = row
        else:
            with self.lock:
                self._ignore(peer, f"not a HELLO or ROW line: {line[:80]!r}")

    def _sender(self, name: str, peer: str) -> str:
        """'' when ``name`` is another tray of the step and ``peer`` its planned address; else why not."""
        tray = next((t for i, t in enumerate(self.plan.trays) if t.name == name and i != self.plan.me), None)
        if tray is None:
            return f"{name[:80]!r} is no other tray of this step"
        if not _same_address(peer, tray.address):
            return f"{tray.name} speaks from {tray.address}, not from {peer}"
        return ""

    def _ignore(self, peer: str, why: str) -> None:
        """Count a refused line, and remember the first few (the lock is held)."""
        self.ignored_count += 1
        if len(self.ignored) < _MAX_IGNORED:
            self.ignored.append((peer, why))


def parse_row(plan: Plan, text: str) -> tuple[dict[str, Any], str]:
    """A tray's row from a ``ROW`` line: ``(row, '')``, or ``({...}, why)`` when it is not one.

    Exactly what :func:`run` sends: ``from``, a tray of the step; ``to``, for
    other trays of the step, an outcome (a string of at most
    :data:`_MAX_OUTCOME` characters) per range; ``listen``, a problem per range.
    """
    try:
        row = json.loads(text)
    except ValueError:
        return {}, "not JSON"
    if not isinstance(row, dict) or set(row) != {"from", "to", "listen"}:
        return {}, "not a row (from, to, listen)"
    names, labels = {t.name for t in plan.trays}, {label for label, _, _ in plan.ranges}
    src, to, listen = row["from"], row["to"], row["listen"]
    if not isinstance(src, str) or src not in names:
        return {}, "'from' is no tray of this step"
    if not isinstance(to, dict) or not set(to) <= names - {src}:
        return row, f"'to' of {src} is not a map of the step's other trays"
    if not all(_outcomes(results, labels) for results in to.values()) or not _outcomes(listen, labels):
        return row, f"the outcomes of {src} are not short texts per range"
    return row, ""


def _outcomes(value: object, labels: set[str]) -> bool:
    """Whether ``value`` maps some of ``labels`` to strings of at most :data:`_MAX_OUTCOME` characters."""
    return (
        isinstance(value, dict)
        and set(value) <= labels
        and all(isinstance(v, str) and len(v) <= _MAX_OUTCOME for v in value.values())
    )


def _same_address(a: str, b: str) -> bool:
    """Whether two textual IP addresses are the same (IPv6 spelled either way; an IPv4-mapped peer as IPv4)."""
    import ipaddress

    try:
        x, y = (ipaddress.ip_address(s.split("%", 1)[0]) for s in (a, b))
    except ValueError:
        return a == b
    x = getattr(x, "ipv4_mapped", None) or x
    y = getattr(y, "ipv4_mapped", None) or y
    return x == y


def shown(text: str) -> str:
    r"""``text`` as it may reach a terminal: every character that is not printable as itself escaped (``\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _read_line(conn: socket.socket, deadline: float, limit: int) -> str:
    """One line from ``conn`` by ``deadline`` (``time.monotonic``), in all however the bytes come; ``limit`` bytes.

    Raises:
        socket.timeout: the deadline passed before a newline, ``limit`` bytes or the end.
    """
    data = b""
    while b"\n" not in data and len(data) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no whole line in time")
        conn.settimeout(left)
        chunk = conn.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()


def _contact(plan: Plan, index: int, label: str, line: str, deadline: float) -> str:
    """Reach tray ``index``'s listener in range ``label`` and send ``line``: 'ok:<port>' or why not.

    Each round tries every candidate port; rounds repeat ``_RETRY_PAUSE_S``
    apart until ``deadline`` (tenacity, imported with this module, before the
    check's window opens: an admin command, where its import delays no job;
    the hooks' readiness wait is a plain loop).
    """

    def one_round() -> str:
        why: dict[str, list[int]] = {}
        for port in plan.ports(index, label):
            problem = _try(plan, index, label, port, line)
            if not problem:
                return f"ok:{port}"
            why.setdefault(problem, []).append(port)
        return "; ".join(f"{problem} on port {', '.join(map(str, ports))}" for problem, ports in why.items())

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda outcome: not outcome.startswith("ok:")),
        stop=lambda _rs: time.monotonic() >= deadline,
        wait=tenacity.wait_fixed(_RETRY_PAUSE_S),
        retry_error_callback=lambda rs: rs.outcome.result() if rs.outcome else "no attempt",
    )
    result: str = retrying(one_round)
    return result


def _try(plan: Plan, index: int, label: str, port: int, line: str) -> str:
    """One connection from this tray's address: '' when the right listener answered and took ``line``."""
    peer = plan.trays[index]
    try:
        conn = socket.create_connection(
            (peer.address, port), timeout=_CONNECT_TIMEOUT_S, source_address=(plan.own.address, 0)
        )
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timed out (dropped: a firewall?)"
    except OSError as exc:
        return exc.strerror or str(exc)
    banner = f"{BANNER} {plan.job_id} {peer.name} {label}"
    deadline = time.monotonic() + plan.line_timeout_s  # the greeting and our line, in all
    with conn:
        try:
            if _read_line(conn, deadline, len(banner) + 1) != banner:
                return "another program answers"
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.sendall(f"{line}\n".encode())
        except OSError:  # socket.timeout included: connected, but no greeting in time
            return "another program answers"
    return ""


def _check_all(plan: Plan, deadline: float) -> dict[str, dict[str, str]]:
    """This tray's row: for every peer and range, 'ok:<port>' or why it was blocked (in parallel)."""
    peers = [i for i in range(len(plan.trays)) if i != plan.me]
    jobs = [(i, label) for i in peers for label, _, _ in plan.ranges]
    if not jobs:
        return {}
    hello = f"HELLO {plan.own.name}"
    with ThreadPoolExecutor(max_workers=min(64, len(jobs))) as pool:
        found = list(pool.map(lambda job: _contact(plan, job[0], job[1], hello, deadline), jobs))
    row: dict[str, dict[str, str]] = {}
    for (i, label), outcome in zip(jobs, found):
        row.setdefault(plan.trays[i].name, {})[label] = outcome
    return row


def run(plan: Plan) -> Report:
    """Listen, check every peer, report to the first tray; what this tray found (on the first tray, every row)."""
    start = time.monotonic()
    listener = _Listener(plan)
    listener.open()
    server = threading.Thread(target=listener.serve, daemon=True)
    server.start()
    try:
        out = _check_all(plan, start + plan.timeout_s)
        row = {"from": plan.own.name, "to": out, "listen": listener.problems}
        if plan.me == 0:
            with listener.lock:
                listener.rows[plan.own.name] = row
        else:
            _contact(plan, 0, "server", "ROW " + json.dumps(row), time.monotonic() + plan.timeout_s)
        # checks against a port that answers slowly or drops packets can run past the window: so may the peers'
        _linger(plan, listener, max(start + 2 * plan.timeout_s, time.monotonic() + plan.timeout_s))
    finally:
        listener.stop.set()
        server.join()
    return _report(plan, out, listener)


def _linger(plan: Plan, listener: _Listener, until: float) -> None:
    """Keep listening until every peer reached both our ports (and, on the first tray, sent its row)."""
    peers = {t.name for i, t in enumerate(plan.trays) if i != plan.me}
    while time.monotonic() < until:
        with listener.lock:
            heard = all(peers <= listener.reached_by[label] for label in listener.socks)
            rows = plan.me != 0 or set(listener.rows) >= {t.name for t in plan.trays}
        if heard and rows:
            return
        time.sleep(0.05)


@dataclasses.dataclass(frozen=True)
class Report:
    """What one tray's ``netcheck`` found: its ports, what it reached, who reached it; on the first tray, every row.

    ``reached`` holds, per other tray and range, ``ok:<port>`` or why it was
    blocked; ``rows`` (the first tray only) every tray's row as it arrived,
    checked (:func:`parse_row`).  Texts from the network are data: :meth:`text`
    prints them escaped, :meth:`data` keeps them as strings.
    """

    plan: Plan
    listening: Mapping[str, int]
    problems: Mapping[str, str]
    reached: Mapping[str, Mapping[str, str]]
    not_reached_by: tuple[str, ...]
    ignored_count: int
    ignored: tuple[tuple[str, str], ...]
    rows: Mapping[str, Mapping[str, Any]] | None

    @property
    def blocked(self) -> list[tuple[str, str, str]]:
        """``(peer, range, why)`` of every check this tray could not make."""
        return [(peer, label, why) for peer, r in self.reached.items() for label, why in r.items() if not _ok(why)]

    @property
    def failed(self) -> bool:
        """Anything blocked or not reached here, a port not listened on, or (first tray) a row blocked or missing."""
        mine = bool(self.blocked or self.not_reached_by or self.problems)
        return mine or (self.rows is not None and render_matrix(self.plan, self.rows)[1])

    def text(self) -> str:
        """The tray's line (after the matrix, on the first tray), every text from the network escaped."""
        own, plan = self.plan.own, self.plan
        parts = [f"{own.name} ({own.address}): listening on " + _listening(plan, self.listening, self.problems)]
        parts += [f"BLOCKED to {peer} {label}: {why}" for peer, label, why in self.blocked]
        if self.not_reached_by:
            parts.append("not reached by " + ", ".join(self.not_reached_by))
        if not self.blocked and not self.not_reached_by and not self.problems:
            parts.append(f"reached all {len(plan.trays) - 1} other trays on both ranges, and was reached by them")
        if self.ignored_count:
            named = "; ".join(f"from {peer}: {why}" for peer, why in self.ignored)
            more = self.ignored_count - len(self.ignored)
            parts.append(f"ignored {self.ignored_count} line(s) ({named}{f'; {more} more' if more else ''})")
        matrix = render_matrix(plan, self.rows)[0] if self.rows is not None else ""
        return matrix + shown("; ".join(parts)) + "\n"

    def data(self) -> JsonObject:
        """``netcheck --json``'s ``data``: this tray, its ports and outcomes; ``matrix`` on the first tray."""
        plan = self.plan
        return {
            "job_id": plan.job_id,
            "tray": plan.own.name,
            "address": plan.own.address,
            "ranges": [{"range": label, "low": lo, "high": hi} for label, lo, hi in plan.ranges],
            "listening": dict(self.listening),
            "listen_problems": dict(self.problems),
            "reached": {peer: dict(r) for peer, r in self.reached.items()},
            "not_reached_by": list(self.not_reached_by),
            "ignored": [{"from": peer, "why": why} for peer, why in self.ignored],
            "ignored_count": self.ignored_count,
            "matrix": _matrix(plan, self.rows) if self.rows is not None else None,
            "ok": not self.failed,
        }


def _report(plan: Plan, reached: dict[str, dict[str, str]], listener: _Listener) -> Report:
    missing = sorted(
        f"{t.name} ({label})"
        for label in listener.socks
        for i, t in enumerate(plan.trays)
        if i != plan.me and t.name not in listener.reached_by[label]
    )
    with listener.lock:
        rows = dict(listener.rows) if plan.me == 0 else None
        ignored = (listener.ignored_count, tuple(listener.ignored))
    return Report(plan, dict(listener.ports), dict(listener.problems), reached, tuple(missing), *ignored, rows)


def _listening(plan: Plan, ports: Mapping[str, int], problems: Mapping[str, str]) -> str:
    return ", ".join(
        f"{label} port {ports[label]}" if label in ports else f"NO {label} port ({problems.get(label, '')})"
        for label, _, _ in plan.ranges
    )


def _matrix(plan: Plan, rows: Mapping[str, Mapping[str, Any]]) -> JsonObject:
    """The matrix as ``--json`` gives it: for every tray (from), every tray (to) and its cell (``render_matrix``)."""
    labels = [label for label, _, _ in plan.ranges]
    names = [t.name for t in plan.trays]
    return {src: {dst: _cell(src, dst, rows.get(src), labels)[0] for dst in names} for src in names}


def _ok(outcome: str) -> bool:
    return outcome.startswith("ok:")


def render_matrix(plan: Plan, rows: Mapping[str, Mapping[str, Any]]) -> tuple[str, bool]:
    """The tray-by-tray matrix (rows: from, columns: to) and whether anything was blocked or unknown.

    A cell is ``ok`` (both ranges reached), ``server``, ``cmd`` or ``both`` (the
    ranges that were blocked), ``?`` (that tray's row never arrived) or ``-``.
    The rows are :func:`parse_row`'s; every line is :func:`shown`, escaped.
    """
    names = [t.name for t in plan.trays]
    width = max(6, *(len(n) for n in names))
    labels = [label for label, _, _ in plan.ranges]
    ranges = ", ".join(f"{label} ports {lo}-{hi}" for label, lo, hi in plan.ranges)
    lines = [
        f"netcheck job {plan.job_id}: {len(names)} trays; {ranges}",
        " " * (width + 5) + " " + _cells(names, width),
    ]
    bad, details = False, []
    for src in names:
        row = rows.get(src)
        if row is None:
            details.append(f"  {src}: no report (its netcheck did not run, or cannot reach {names[0]}'s server port)")
        cells = []
        for dst in names:
            cell, why = _cell(src, dst, row, labels)
            cells.append(cell)
            bad = bad or cell not in ("ok", "-")
            details += [f"  {src} -> {dst} {w}" for w in why]
        lines.append(f"from {src:<{width}} " + _cells(cells, width))
    if details:
        lines += ["blocked or unknown:", *details]
    return "".join(f"{shown(line)}\n" for line in lines), bad


def _cell(src: str, dst: str, row: Mapping[str, Any] | None, labels: list[str]) -> tuple[str, list[str]]:
    if src == dst:
        return "-", []
    if row is None:
        return "?", []
    results = row.get("to", {}).get(dst, {})
    blocked = [label for label in labels if not _ok(str(results.get(label, "")))]
    if not blocked:
        return "ok", []
    cell = "both" if len(blocked) > 1 else blocked[0]
    return cell, [f"{label}: {results.get(label, 'not checked')}" for label in blocked]


def _cells(values: list[str], width: int) -> str:
    return " ".join(f"{v:>{width}}" for v in values)


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl netcheck``: one task per tray of a job step; any user; prints and exits 1 when blocked."""
    from imexctl.hooks.runtime import Needs, build

    if var.value(env, var.LOCALID) not in ("", "0"):  # one task per tray listens; others would collide
        return 0
    # the file the hooks read under slurmd, also in a task without SLURM_CONF: the ranges the prolog uses
    needs = Needs(logs="stderr", gpu="none")
    built = build("netcheck", env, needs, config=args.config, verbose=args.verbose, host=host)
    cfg, host, env = built.rt.settings, built.rt.host, built.lookup
    report = run(plan_from_env(env, cfg, host, max(1.0, args.timeout)))
    if getattr(args, "json", False):
        from imexctl.platform.errors import NetcheckBlocked
        from imexctl.platform.output import print_json

        blocked = NetcheckBlocked(f"{report.plan.own.name}: {'; '.join(_why_failed(report))}")
        print_json(report, errors=[blocked] if report.failed else [])
    else:
        sys.stdout.write(report.text())
    return 1 if report.failed else 0


def _why_failed(report: Report) -> list[str]:
    """What made the check fail, in short: for ``netcheck --json``'s error message."""
    why = [f"blocked to {peer} {label}" for peer, label, _ in report.blocked]
    why += [f"not reached by {who}" for who in report.not_reached_by]
    why += [f"no {label} port" for label in report.problems]
    if report.rows is not None and render_matrix(report.plan, report.rows)[1]:
        why.append("the matrix has blocked or missing rows")
    return why
