"""The running simulated daemon: peer links, gossip, command service, signals.

One asyncio loop per process.  Every node keeps one outgoing TCP link to every
node of the nodes file, itself included (the real daemon's log shows it
"connecting" to its own ID, design.md source imex-log).  Over its outgoing links a node sends
a heartbeat (its node ID) every ``GOSSIP_INTERVAL_S``; a link whose peer goes quiet
for ``REPORT_TTL_S`` is dropped.

The command service answers only for this node: its state and its own row
of the connectivity table.  ``nvidia-imex-ctl -N`` builds the domain view by
asking every node's command service itself, over the network, as the real
ctl does (kubernetes-sigs/dra-driver-nvidia-gpu PR #540); a daemon never
answers for its peers.  The wire protocol is newline-delimited JSON and
private to the simulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import time
import uuid
from typing import Any, Callable, Final

from imexctl.sim.config import SimConfig
from imexctl.sim.faults import Faults
from imexctl.sim.logfile import SimLog

__all__ = ["Identity", "Node", "Sockets"]

GOSSIP_INTERVAL_S: Final = 0.2
REPORT_TTL_S: Final = 1.5
BACKOFF_START_S: Final = 0.5
BACKOFF_MAX_S: Final = 3.0
HANDSHAKE_TIMEOUT_S: Final = 2.0
SIGUSR1_WINDOW_S: Final = 5.0
SHUTDOWN_NOTIFY_S: Final = 0.3
CRASH_EXIT_CODE: Final = 134


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who this daemon is within its nodes file."""

    entries: tuple[str, ...]
    addresses: tuple[str, ...]
    own_id: int
    map_key: str
    version: str
    hostname: str

    @property
    def own_ip(self) -> str:
        """This node's address."""
        return self.addresses[self.own_id]


@dataclasses.dataclass
class Sockets:
    """Sockets bound before the loop starts (so bind errors surface before daemonizing)."""

    peer: socket.socket
    cmd_tcp: socket.socket | None = None
    cmd_unix: socket.socket | None = None
    unix_path: str = ""


@dataclasses.dataclass
class _Link:
    """This node's outgoing connection to one node."""

    peer_id: int
    status: str = "NEVER_CONNECTED"
    times: int = 0
    lost_at: float | None = None
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None


async def _read_msg(reader: asyncio.StreamReader, timeout: float) -> dict[str, Any] | None:
    """Return the next JSON message, or ``None`` on EOF, timeout or garbage."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
        msg = json.loads(line) if line else None
    except (asyncio.TimeoutError, OSError, ValueError):
        return None
    return msg if isinstance(msg, dict) else None


def _send(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    """Queue one JSON message."""
    writer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")


class Node:
    """One simulated ``nvidia-imex`` process."""

    def __init__(self, ident: Identity, cfg: SimConfig, faults: Faults, log: SimLog, socks: Sockets) -> None:
        self.ident, self.cfg, self.faults, self.log, self.socks = ident, cfg, faults, log, socks
        self.state = "INITIALIZING"
        self.instance = uuid.uuid4().hex
        self.links = {i: _Link(i) for i in range(len(ident.entries))}
        self.instances: dict[int, str] = {}
        self.stopping = asyncio.Event()
        self.servers: list[asyncio.AbstractServer] = []
        self.last_usr1: float | None = None
        self.exit_code = 0
        self.up_logged = False
        self.started = time.monotonic()
        self.stop_asked: float | None = None

    # ---------------------------------------------------------------- run

    async def run(self, on_ready: Callable[[], None] | None = None) -> int:
        """Serve until a stop signal; return the exit code."""
        await self._start_servers()
        self._install_signals()
        if self.faults.crash_after_s is not None:
            asyncio.get_running_loop().call_later(self.faults.crash_after_s, self._crash)
        if on_ready is not None:
            on_ready()
        lifecycle = asyncio.ensure_future(self._lifecycle())
        await self.stopping.wait()
        lifecycle.cancel()
        await self._shutdown()
        return self.exit_code

    async def _start_servers(self) -> None:
        """Start serving on the sockets bound at start-up."""
        self.servers.append(await asyncio.start_server(self._serve_peer, sock=self.socks.peer))
        if self.socks.cmd_tcp is not None:
            self.servers.append(await asyncio.start_server(self._serve_cmd, sock=self.socks.cmd_tcp))
        if self.socks.cmd_unix is not None:
            self.servers.append(await asyncio.start_unix_server(self._serve_cmd, sock=self.socks.cmd_unix))

    def _install_signals(self) -> None:
        """Route SIGTERM/INT/QUIT to shutdown, SIGUSR1 to reconnect, SIGHUP to a log line."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(sig, self._on_stop, sig.name)
        loop.add_signal_handler(signal.SIGUSR1, self._on_usr1)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)

    async def _lifecycle(self) -> None:
        """Walk INITIALIZING -> WAITING_FOR_PEERS -> READY."""
        if self.faults.slow_start_s:
            self.log.info(f"Simulated slow start: staying INITIALIZING for {self.faults.slow_start_s:g} s")
            await asyncio.sleep(self.faults.slow_start_s)
        self._set_state("WAITING_FOR_PEERS")
        self.log.info(f"Creating gRPC channels to all peers (nPeers = {len(self.links)}).")
        for link in self.links.values():
            link.task = asyncio.ensure_future(self._link_loop(link))
        if self.cfg.wait_for_quorum == "FULL":
            self.log.info("IMEX_WAIT_FOR_QUORUM == FULL, waiting for connections to all nodes.")
            while any(link.status != "CONNECTED" for link in self.links.values()):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # links change in many tasks; polling their states is simplest
        else:
            self.log.info(
                "IMEX_WAIT_FOR_QUORUM != FULL, continuing initialization without waiting for connections to all nodes."
            )
        if self.faults.never_ready:
            self.log.info("Simulated fault never_ready: staying WAITING_FOR_PEERS")
            return
        self.log.info("GPU event successfully subscribed")
        self._set_state("READY")
        self._note_up()

    def _set_state(self, state: str) -> None:
        """Change and log the daemon state."""
        self.state = state
        self.log.info(f"IMEX daemon state is now {state}")

    # ---------------------------------------------------------------- signals

    def _on_stop(self, name: str) -> None:
        """Begin a clean shutdown (after ``stop_delay`` seconds; never, under ``ignore_sigterm``)."""
        if self.stopping.is_set() or self.state == "SHUTTING_DOWN":
            return
        if self.faults.ignore_sigterm:
            self.log.info(f"Simulated fault ignore_sigterm: ignoring {name}")
            return
        self.log.info(f"Received signal {name}, shutting down")
        self.stop_asked = time.monotonic()
        self.state = "SHUTTING_DOWN"
        if self.faults.stop_delay_s:
            self.log.info(f"Simulated fault stop_delay: shutting down in {self.faults.stop_delay_s:g} s")
            asyncio.get_running_loop().call_later(self.faults.stop_delay_s, self.stopping.set)
        else:
            self.stopping.set()

    def _on_hup(self) -> None:
        """SIGHUP dumps the verbose in-memory buffer in the real daemon; the simulator has none."""
        self.log.info("Received SIGHUP: no in-memory log buffer to dump (simulator)")

    def _on_usr1(self) -> None:
        """Restart all outgoing connections, at most once per 5 s (design.md source imex-signals)."""
        now = time.monotonic()
        if self.last_usr1 is not None and now - self.last_usr1 < SIGUSR1_WINDOW_S:
            self.log.info("Ignoring SIGUSR1 received within 5 seconds of the previous one")
            return
        self.last_usr1 = now
        self.log.info("Received SIGUSR1: restarting all outgoing client connections")
        if self.state in ("INITIALIZING", "SHUTTING_DOWN"):
            return
        for link in self.links.values():
            if link.task is not None:
                link.task.cancel()
            link.task = asyncio.ensure_future(self._link_loop(link))

    def _crash(self) -> None:
        """Die like a killed process: no notification, no clean-up."""
        self.log.critical(
            f"Simulated crash (crash_after={self.faults.crash_after_s:g}): "
            f"exiting {CRASH_EXIT_CODE} without notifying peers"
        )
        os._exit(CRASH_EXIT_CODE)

    async def _shutdown(self) -> None:
        """Notify peers, close everything, remove the Unix socket."""
        writers = [link.writer for link in self.links.values() if link.writer is not None]
        for writer in writers:
            _send(writer, {"type": "shutdown", "node_id": self.ident.own_id})
        if writers:
            drains = [asyncio.ensure_future(w.drain()) for w in writers]
            await asyncio.wait(drains, timeout=SHUTDOWN_NOTIFY_S)
        for link in self.links.values():
            if link.task is not None:
                link.task.cancel()
        for server in self.servers:
            server.close()
        if self.socks.unix_path:
            try:
                os.unlink(self.socks.unix_path)
            except OSError:
                pass
        self.log.info("IMEX daemon shut down cleanly")
        if self.stop_asked is not None:  # sim only: bench/run subtracts the time from the signal to the exit
            took = time.monotonic() - self.stop_asked
            self.log.info(f"Simulator: shutdown took {took:.6f} s, signalled at monotonic {self.stop_asked:.6f}")

    # ---------------------------------------------------------------- outgoing links

    def _refused(self, *names: str) -> bool:
        """Whether the refuse_peer fault names any of ``names``."""
        return any(n and n in self.faults.refuse_peers for n in names)

    async def _link_loop(self, link: _Link) -> None:
        """Connect to one node, keep the link up, reconnect with back-off."""
        peer = link.peer_id
        entry, addr = self.ident.entries[peer], self.ident.addresses[peer]
        if self._refused(entry, addr):
            self.log.info(f"Simulated fault refuse_peer: never connecting to node {peer} ({entry})")
            return
        backoff, attempt = BACKOFF_START_S, 0
        while not self.stopping.is_set():
            attempt += 1
            if attempt == 1 or attempt % 10 == 0:
                self.log.info(
                    f"Attempting connection for target node {peer} - {entry}:{self.cfg.server_port}, attempt #{attempt}"
                )
            outcome = await self._connect_once(link, entry)
            if outcome in ("VERSION_MISMATCH", "NODE_MAP_MISMATCH"):
                return
            if outcome == "CONNECTED":
                backoff, attempt = BACKOFF_START_S, 0
                continue
            if link.status == "CONNECTED":
                self._lost(link)  # a SIGUSR1 restart that could not reconnect
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _connect_once(self, link: _Link, entry: str) -> str:
        """Make one connection attempt and, if it succeeds, gossip until it drops."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(entry, self.cfg.server_port, **self._local_addr(link.peer_id)),
                HANDSHAKE_TIMEOUT_S,
            )
        except (OSError, asyncio.TimeoutError):
            return "FAILED"
        try:
            outcome = await self._handshake(link, reader, writer)
            if outcome == "CONNECTED":
                await self._pump(reader, writer)
                self._lost(link)
            return outcome
        finally:
            link.writer = None
            writer.close()

    def _local_addr(self, peer_id: int) -> dict[str, Any]:
        """Bind outgoing links to the own address when both ends are IP literals of one family."""
        own, peer = self.ident.own_ip, self.ident.addresses[peer_id]
        if own and peer and (":" in own) == (":" in peer):
            return {"local_addr": (own, 0)}
        return {}

    def _hello(self) -> dict[str, Any]:
        """Return the handshake message this node sends."""
        ident = self.ident
        return {
            "type": "hello",
            "node_id": ident.own_id,
            "entry": ident.entries[ident.own_id],
            "addr": ident.own_ip,
            "map_key": ident.map_key,
            "version": ident.version,
            "instance": self.instance,
        }

    async def _handshake(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        """Exchange hello/welcome; return CONNECTED, FAILED or a mismatch status."""
        _send(writer, self._hello())
        reply = await _read_msg(reader, HANDSHAKE_TIMEOUT_S)
        if reply is None:
            return "FAILED"
        peer, entry = link.peer_id, self.ident.entries[link.peer_id]
        if reply.get("type") == "reject":
            link.status = str(reply.get("reason"))
            self._log_mismatch(link.status, peer, entry)
            return link.status
        link.status, link.lost_at, link.writer = "CONNECTED", None, writer
        link.times += 1
        self.log.info(
            f"Connection established to node {peer} with ip address {entry}. Number of times connected: {link.times}"
        )
        self._note_up()
        return "CONNECTED"

    def _note_up(self) -> None:
        """Log (sim only, once) when this node is READY with every link CONNECTED: its part of a domain UP.

        The domain is UP when every node has logged this line (``ctl -N`` then
        says UP).  The line carries CLOCK_MONOTONIC, system-wide on Linux, so
        bench/run can time the prolog's exit against the last tray's line.
        """
        if self.up_logged or self.state != "READY" or any(k.status != "CONNECTED" for k in self.links.values()):
            return
        self.up_logged = True
        self.log.info(
            f"Simulator: READY and all {len(self.links)} links CONNECTED at monotonic {time.monotonic():.6f}, "
            f"started at {self.started:.6f}"
        )

    def _log_mismatch(self, status: str, peer: int, entry: str) -> None:
        """Log why communication with a peer is disabled."""
        if status == "NODE_MAP_MISMATCH":
            self.log.error(f"Node configuration mapping mismatch with node {peer} ({entry}), communication disabled")
        else:
            self.log.error(f"Version mismatch with node {peer} ({entry}), communication disabled")

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send a heartbeat every GOSSIP_INTERVAL_S until the peer goes away (its end of the link closes)."""
        beat = json.dumps({"type": "status", "node_id": self.ident.own_id}, separators=(",", ":")).encode() + b"\n"
        closed = asyncio.ensure_future(reader.read(4096))  # the peer sends nothing after its welcome
        try:
            while not self.stopping.is_set():
                writer.write(beat)
                await writer.drain()
                done, _ = await asyncio.wait((closed,), timeout=GOSSIP_INTERVAL_S)
                if done:
                    if closed.exception() is not None or not closed.result():
                        return
                    closed = asyncio.ensure_future(reader.read(4096))
        except OSError:
            return
        finally:
            closed.cancel()

    def _lost(self, link: _Link) -> None:
        """Mark a link that was connected as lost (R, then D after the grace time)."""
        if self.stopping.is_set():
            return
        link.status, link.lost_at = "RECOVERING", time.monotonic()
        entry = self.ident.entries[link.peer_id]
        self.log.error(f"Node disconnect event detected for node {link.peer_id} with address {entry}")
        grace = self.cfg.grace_time_s
        if grace >= 0:
            asyncio.get_running_loop().call_later(grace, self._disconnect, link, link.lost_at)

    def _disconnect(self, link: _Link, lost_at: float) -> None:
        """After the grace time, a link still down becomes DISCONNECTED."""
        if link.status == "RECOVERING" and link.lost_at == lost_at:
            link.status = "DISCONNECTED"
            self.log.info(f"Grace time over for node {link.peer_id}: cleaning up, connection DISCONNECTED")

    # ---------------------------------------------------------------- incoming links

    def _judge(self, hello: dict[str, Any]) -> str | None:
        """Return why a hello is rejected, or ``None`` to accept it."""
        if hello.get("map_key") != self.ident.map_key:
            return "NODE_MAP_MISMATCH"
        if hello.get("version") != self.ident.version:
            return "VERSION_MISMATCH"
        return None

    async def _serve_peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handle one incoming link: handshake, then store the peer's gossip."""
        try:
            await self._peer_session(reader, writer)
        except asyncio.CancelledError:
            pass  # loop shutdown; a cancelled handler task makes asyncio 3.11 log a bogus traceback

    async def _peer_session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handshake, then store the peer's gossip until it goes away."""
        try:
            hello = await _read_msg(reader, HANDSHAKE_TIMEOUT_S)
            if hello is None or hello.get("type") != "hello":
                return
            source = (writer.get_extra_info("peername") or ("",))[0]
            if self._refused(str(hello.get("entry")), str(hello.get("addr")), source):
                return  # refuse_peer: drop without an answer
            verdict = self._judge(hello)
            reply = {"type": "reject" if verdict else "welcome", "reason": verdict, "node_id": self.ident.own_id}
            _send(writer, reply)
            await writer.drain()
            if verdict is None:
                self._note_instance(hello)
                await self._receive_gossip(reader)
        except OSError:
            return
        finally:
            writer.close()

    def _note_instance(self, hello: dict[str, Any]) -> None:
        """Log when a peer comes back as a new process (the real daemon then cleans up at once)."""
        peer, instance = hello.get("node_id"), str(hello.get("instance"))
        if not isinstance(peer, int):
            return
        before = self.instances.get(peer)
        self.instances[peer] = instance
        if before is not None and before != instance:
            self.log.info(f"Node {peer} reconnected as a new IMEX instance; cleaning up its old state immediately")

    async def _receive_gossip(self, reader: asyncio.StreamReader) -> None:
        """Read the peer's heartbeats until it goes quiet for REPORT_TTL_S, leaves or announces its shutdown.

        One timer per link, pushed back by each heartbeat, ends a quiet link
        (cheaper than a timeout per message: 72 trays gossip on 2 cores).
        """
        loop = asyncio.get_running_loop()
        heard = [loop.time()]
        task = asyncio.current_task()
        assert task is not None

        def watch() -> None:
            quiet = loop.time() - heard[0]
            if quiet >= REPORT_TTL_S:
                task.cancel()
            else:
                timers[0] = loop.call_later(REPORT_TTL_S - quiet, watch)

        timers = [loop.call_later(REPORT_TTL_S, watch)]
        try:
            while not self.stopping.is_set():
                try:
                    line = await reader.readline()
                    msg = json.loads(line) if line else None
                except ValueError:  # garbage, or a line over the stream's limit
                    return
                heard[0] = loop.time()
                if not isinstance(msg, dict):
                    return
                peer = msg.get("node_id")
                if not isinstance(peer, int) or peer not in self.links:
                    return
                if msg.get("type") == "shutdown":
                    self.log.info(f"Received notification of shutdown from node {peer}")
                    return
        except asyncio.CancelledError:
            if loop.time() - heard[0] < REPORT_TTL_S:
                raise  # not our timer: the loop is shutting down
        finally:
            timers[0].cancel()

    # ---------------------------------------------------------------- command service

    async def _serve_cmd(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one ctl request: ``{"cmd": "query"}`` or ``{"cmd": "domain"}``."""
        try:
            await self._cmd_session(reader, writer)
        except asyncio.CancelledError:
            pass  # see _serve_peer

    async def _cmd_session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one request and answer it (never, under hang_ctl; not at all to others, under block_cmd)."""
        try:
            if self.faults.block_cmd and not self._from_self(writer):
                writer.transport.abort()  # a firewall's reject: the connection is reset unanswered
                return
            request = await _read_msg(reader, 10.0)
            if self.faults.hang_ctl:
                await self.stopping.wait()
                return
            if request is None:
                return
            _send(writer, self._answer(request))
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def _from_self(self, writer: asyncio.StreamWriter) -> bool:
        """Whether a command connection comes from this node's own address."""
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            return True
        peer = writer.get_extra_info("peername")
        return bool(peer) and peer[0] == self.ident.own_ip

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """Return the response to one ctl request: this node's state, or its table row."""
        cmd = request.get("cmd")
        if cmd == "query":
            return {"state": self.state}
        if cmd == "node":
            return {"node": self.own_status()}
        return {"error": f"unknown command {cmd!r}"}

    def own_status(self) -> dict[str, Any]:
        """This node's state, version, host name and row of the connectivity table."""
        return {
            "state": self.state,
            "version": self.ident.version,
            "hostname": self.ident.hostname,
            "row": {str(i): link.status for i, link in self.links.items()},
        }
