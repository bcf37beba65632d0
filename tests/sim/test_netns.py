"""The simulator across network namespaces: ``-N`` needs every tray's command service on the network.

Each tray runs in its own network namespace on a private bridge, as trays of a
rack sit on their own hosts.  ``nvidia-imex-ctl -N`` asks every node's command
service itself (kubernetes-sigs/dra-driver-nvidia-gpu PR #540: with
``IMEX_CMD_BIND_INTERFACE_IP=127.0.0.1`` "-q" worked and "-N" did not).  So a
command service that listens only on loopback or on a Unix socket must never
give a domain ``UP``, although the daemons' peer links are all connected,
while the config imexctl writes (the tray's own address, one explicit port)
gives ``UP`` on every tray.

Needs root, ``ip`` and ``nsenter``; addresses come from 198.19.0.0/16 (RFC 2544
benchmarking space, as the Slurm lab uses 198.18.0.0/24) and exist only inside
the namespaces this module creates.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.imex.ctl import parse_domain_json
from tests.simhelpers import REPO, wait_for
from tests.support.ci import unavailable

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("nsenter")),
    reason="needs root, iproute2 and nsenter to create network namespaces",
)

TRAYS = 3
SERVER_PORT, CMD_PORT = 61500, 62500


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")


_RACKS = itertools.count()


def _free_tag(trays: int) -> str:
    """A tag no bridge, veth or namespace on this machine has: the kernel frees a deleted namespace's veths
    later, in its own time (cleanup_net), so the last rack's names may still be taken for a while."""
    while True:
        tag = f"{os.getpid() % 10000}{next(_RACKS)}"
        names = [f"imxnb{tag}"[:15], *(f"imxnb{tag}v{i}"[:15] for i in range(trays))]
        if not any(Path("/sys/class/net", n).exists() for n in names) and not any(
            Path(f"/run/netns/imxns{tag}-{i}").exists() for i in range(trays)
        ):
            return tag


class Rack:
    """Trays in network namespaces on one bridge; records and removes everything it creates."""

    def __init__(self, trays: int) -> None:
        tag = _free_tag(trays)
        self.bridge = f"imxnb{tag}"[:15]
        self.netns = [f"imxns{tag}-{i}" for i in range(trays)]
        subnet = f"198.19.{random.randrange(1, 250)}"
        self.addresses = [f"{subnet}.{11 + i}" for i in range(trays)]
        self.dir = Path(os.path.realpath(__import__("tempfile").mkdtemp(prefix="imxn", dir="/tmp")))
        self.procs: list[subprocess.Popen[str]] = []
        try:
            self._wire()
        except BaseException:
            self.close()  # what it made so far: a failed rack leaves nothing behind either
            raise
        (self.dir / "nodes.cfg").write_text("".join(f"{a}\n" for a in self.addresses))

    def _wire(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.netns):
            _ip("netns", "add", ns)
            _ip("link", "add", f"{self.bridge}v{i}"[:15], "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"{self.bridge}v{i}"[:15], "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def config(self, i: int, cmd: dict[str, str]) -> Path:
        keys = {
            "LOG_FILE_NAME": str(self.dir / f"log{i}"),
            "DAEMONIZE": "0",
            "BIND_INTERFACE_IP": self.addresses[i],
            "SERVER_PORT": str(SERVER_PORT),
            "IMEX_NODE_CONFIG_FILE": str(self.dir / "nodes.cfg"),
            "IMEX_WAIT_FOR_QUORUM": "NONE",
            "IMEX_CMD_ENABLED": "1",
            **cmd,
        }
        path = self.dir / f"c{i}.cfg"
        path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
        return path

    def _in(self, i: int, *argv: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns[i]}", sys.executable, *argv]

    def start(self, i: int, cmd: dict[str, str]) -> None:
        env = {"PYTHONPATH": str(REPO)}
        self.procs.append(
            subprocess.Popen(
                self._in(i, "-m", "imexctl.sim.daemon", "-c", str(self.config(i, cmd))),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
            )
        )

    def ctl(self, i: int, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._in(i, "-m", "imexctl.sim.ctl", "-c", str(self.dir / f"c{i}.cfg"), *args),
            env={"PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )

    def peers_connected(self, i: int) -> bool:
        """Whether tray ``i``'s daemon logged an established link to every node (the peering works)."""
        try:
            log = (self.dir / f"log{i}").read_text()
        except FileNotFoundError:
            return False
        return all(f"Connection established to node {j} " in log for j in range(len(self.addresses)))

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def rack() -> Iterator[Rack]:
    r = Rack(TRAYS)
    try:
        yield r
    finally:
        r.close()


LOOPBACK_ONLY = {
    # the setup of DRA PR #540: a TCP command port, bound to loopback
    "loopback-port": {"IMEX_CMD_BIND_INTERFACE_IP": "127.0.0.1", "IMEX_CMD_PORT": str(CMD_PORT)},
    # imexctl before this fix: only a Unix socket, no TCP port
    "unix-socket-only": {"IMEX_CMD_PORT": "", "IMEX_CMD_BIND_INTERFACE_IP": "127.0.0.1"},
}


@pytest.mark.parametrize("setup", sorted(LOOPBACK_ONLY))
def test_loopback_only_command_services_never_give_up(rack: Rack, setup: str) -> None:
    """With each tray in its own namespace, a loopback-only command service lets -q answer READY but never
    lets -N report the domain UP, although every daemon has connected to every peer."""
    for i in range(TRAYS):
        cmd = dict(LOOPBACK_ONLY[setup])
        if setup == "unix-socket-only":
            cmd["IMEX_CMD_UNIX_DOMAIN_PATH"] = str(rack.dir / f"s{i}")
        rack.start(i, cmd)
    for i in range(TRAYS):
        wait_for(lambda: rack.ctl(i, "-q").stdout == "READY\n", what=f"tray {i} READY to -q")
        wait_for(lambda: rack.peers_connected(i), what=f"tray {i} connected to every peer")
    until = time.monotonic() + 2.0
    while time.monotonic() < until:
        for i in range(TRAYS):
            done = rack.ctl(i, "-N", "-j")
            dom = parse_domain_json(done.stdout)
            assert dom.status != "UP", f"tray {i} saw UP through a loopback-only command service"
            assert {n.status for n in dom.nodes} == {"UNAVAILABLE"}


def test_own_address_command_service_gives_up_everywhere(rack: Rack) -> None:
    """The config imexctl writes (own address, one port for all) gives UP with every link CONNECTED."""
    for i in range(TRAYS):
        rack.start(
            i,
            {
                "IMEX_CMD_BIND_INTERFACE_IP": rack.addresses[i],
                "IMEX_CMD_PORT": str(CMD_PORT),
                "IMEX_CMD_UNIX_DOMAIN_PATH": "",
            },
        )
    for i in range(TRAYS):
        dom = wait_for(
            lambda: (d := parse_domain_json(rack.ctl(i, "-N", "-j").stdout)).is_up and d, what=f"domain UP on tray {i}"
        )
        assert [n.host for n in dom.nodes] == rack.addresses
        assert not dom.not_connected(include_self=True)


def _nft(ns: str, *args: str) -> None:
    nft = shutil.which("nft", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if nft is None:
        unavailable("nft missing (apt-get install nftables; bash .ci/setup test installs it)")
    subprocess.run(["ip", "netns", "exec", ns, nft, *args], check=True, capture_output=True, timeout=10)


def test_a_tray_that_drops_incoming_job_ports_reaches_its_peers_and_none_reaches_it(rack: Rack) -> None:
    """Tray 2's firewall drops incoming TCP to the job ports (its own traffic on lo passes). Each daemon keeps one
    outgoing link per peer and its -N row shows those: tray 2's row is CONNECTED to both peers, theirs to tray 2
    NEVER_CONNECTED; the others cannot ask tray 2's command port. The kernel's table (what imexctl reads through
    Host.tcp_links) shows no peer connected to tray 2's SERVER_PORT (only its link to itself), and both peers
    connected to tray 0's."""
    _nft(rack.netns[2], "add", "table", "inet", "imxdrop")
    _nft(rack.netns[2], "add", "chain", "inet", "imxdrop", "input", "{ type filter hook input priority 0; }")
    _nft(rack.netns[2], "add", "rule", "inet", "imxdrop", "input", "iifname", "!=", "lo", "tcp", "dport",
         "61000-62999", "drop")  # fmt: skip
    for i in range(TRAYS):
        rack.start(i, {"IMEX_CMD_BIND_INTERFACE_IP": rack.addresses[i], "IMEX_CMD_PORT": str(CMD_PORT)})

    def view(i: int) -> Any:
        done = rack.ctl(i, "-N", "-j", "-t", "1000")
        return parse_domain_json(done.stdout) if done.returncode == 0 else None

    def blocked_view() -> Any:
        dom = view(2)
        rows = {n.node_id: n for n in dom.nodes} if dom else {}
        links = [(2, 0), (2, 1), (0, 1), (1, 0)]
        ok = dom and all(rows[a].connection_to(b).status == "CONNECTED" for a, b in links)  # type: ignore[union-attr]
        return dom if ok and rows[0].status == "READY" and rows[1].status == "READY" else None

    dom = wait_for(blocked_view, 20, what="tray 2 connected out to both peers, and they to each other")
    rows = {n.node_id: n for n in dom.nodes}
    assert [rows[j].connection_to(2).status for j in (0, 1)] == ["NEVER_CONNECTED"] * 2  # type: ignore[union-attr]
    assert rows[0].connection_to(1).status == "CONNECTED"  # type: ignore[union-attr]
    assert {n.node_id: n.status for n in view(0).nodes}[2] == "UNAVAILABLE"

    def links_of(i: int) -> list[list[str]]:
        """[incoming, outgoing] as tray i's prolog reads them (Host.tcp_links, in its namespace)."""
        code = (f"from imexctl.platform.host import RealHost; "
                f"print([sorted(s) for s in RealHost().tcp_links({rack.addresses[i]!r}, {SERVER_PORT})])")  # fmt: skip
        out = subprocess.run(rack._in(i, "-c", code), env={"PYTHONPATH": str(REPO)}, capture_output=True,
                             text=True, timeout=20, check=True)  # fmt: skip
        return eval(out.stdout)  # noqa: S307  # a list of strings this test printed itself

    a = rack.addresses
    assert links_of(2) == [[a[2]], sorted(a)]  # in: its link to itself (on lo) only; out: to all three
    assert wait_for(lambda: links_of(0) == [sorted(a), [a[0], a[1]]], what="tray 0's links: all in, out to 0, 1")
