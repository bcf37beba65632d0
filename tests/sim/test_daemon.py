"""Tests for the simulated nvidia-imex daemon and ctl as real processes on 127.0.0.x.

Only loopback addresses 127.0.0.x and ports in 61000..61999 are used.  Every
wait is a bounded poll; the ``cluster`` fixture kills whatever a test started,
also when it fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from imexctl.imex.ctl import parse_domain_json
from imexctl.sim.ctl import CtlError
from imexctl.sim.ctl import request as ctl_request
from tests.simhelpers import REPO, SimCluster, free_port, wait_for
from tests.support.ctltext import parse_domain_text


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A simulated domain of ``size`` trays (param, default 2), torn down afterwards."""
    size = getattr(request, "param", 2)
    c = SimCluster(size)
    try:
        yield c
    finally:
        c.kill_all()
        assert c.ours() == []


def _exit_code(proc: subprocess.Popen[str], timeout: float = 10.0) -> int:
    return proc.wait(timeout=timeout)


class TestDomainUp:
    @pytest.mark.parametrize("cluster", [1, 2, 4], indirect=True, ids=["1-node", "2-nodes", "4-nodes"])
    def test_all_connected_everywhere(self, cluster: SimCluster) -> None:
        """Every tray reports the domain UP with every node READY and every link CONNECTED."""
        cluster.start_all()
        n = len(cluster.addresses)
        for i in range(n):
            snap = cluster.wait_up(i)
            d = parse_domain_json(json.dumps(snap))
            assert cluster.addresses == [node.host for node in d.nodes]
            assert {("READY", "580.95.05")} == {(node.status, node.version) for node in d.nodes}
            assert d.not_connected(include_self=True) == []

    def test_ctl_cli_end_to_end(self, cluster: SimCluster) -> None:
        """The ctl CLI prints READY for -q, parseable -N text and -N -j -H JSON with host names."""
        cluster.start(0, faults="hostname=tray-a")
        cluster.start(1, faults="hostname=tray-b")
        cluster.wait_up(0)
        cfg = str(cluster.dir / "c0.cfg")
        q = cluster.ctl("-c", cfg, "-q")
        assert (q.returncode, q.stdout) == (0, "READY\n")
        text = cluster.ctl("-c", cfg, "-N")
        assert text.returncode == 0 and parse_domain_text(text.stdout).is_up
        js = cluster.ctl("-c", cfg, "-N", "-j", "-H")
        assert [n.hostname for n in parse_domain_json(js.stdout).nodes] == ["tray-a", "tray-b"]
        plain = cluster.ctl("-c", cfg, "-N", "-j")
        assert [n.hostname for n in parse_domain_json(plain.stdout).nodes] == ["", ""]

    def test_tcp_command_port(self, cluster: SimCluster) -> None:
        """The command service also answers on IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT (-i and -c)."""
        cmd_port = free_port(cluster.addresses[:1])
        cluster.start(
            0, IMEX_CMD_UNIX_DOMAIN_PATH="", IMEX_CMD_PORT=cmd_port, IMEX_CMD_BIND_INTERFACE_IP=cluster.addresses[0]
        )
        cluster.start(1)
        out = wait_for(
            lambda: cluster.ctl("-i", cluster.addresses[0], str(cmd_port), "-q").stdout == "READY\n",
            what="READY over TCP",
        )
        assert out
        via_cfg = cluster.ctl("-c", str(cluster.dir / "c0.cfg"), "-N", "-j")
        assert len(parse_domain_json(via_cfg.stdout).nodes) == 2

    def test_host_names_in_nodes_file(self, cluster: SimCluster) -> None:
        """Host-name entries resolve (localhost) and are shown as written."""
        cluster.write("nodes.cfg", "localhost\n")
        cluster.start(0, BIND_INTERFACE_IP="127.0.0.1", IMEX_CMD_BIND_INTERFACE_IP="127.0.0.1")
        snap = cluster.wait_up(0)
        assert snap["nodes"]["0"]["host"] == "localhost"
        assert "Treating node config entry 'localhost' as a host name." in cluster.log_text(0)

    def test_finds_itself_from_interfaces(self, cluster: SimCluster) -> None:
        """Without BIND_INTERFACE_IP the first nodes-file address on a local interface is the own ID."""
        cluster.write("nodes.cfg", "192.0.2.123\n127.0.0.1\n")
        proc = subprocess.Popen(
            cluster.argv(cluster.config(0, BIND_INTERFACE_IP="")), env=cluster.env(), stderr=subprocess.PIPE, text=True
        )
        cluster.procs[0] = proc
        wait_for(
            lambda: "Identified this node as ID 1, using bind IP of '127.0.0.1'" in cluster.log_text(0), what="own ID 1"
        )


class TestCommandServicePerNode:
    def test_a_daemon_answers_only_for_itself(self, cluster: SimCluster) -> None:
        """The command service gives this node's state and row; there is no domain request to answer
        from gossip, so -N cannot be served by one daemon alone."""
        cluster.start_all()
        cluster.wait_up(0)
        own = ctl_request(("unix", cluster.sock(1)), "node", 2.0)["node"]
        assert (own["state"], sorted(own["row"])) == ("READY", ["0", "1"])
        with pytest.raises(CtlError, match="refused the request"):
            ctl_request(("unix", cluster.sock(1)), "domain", 2.0)

    @pytest.mark.parametrize("cluster", [3], indirect=True)
    def test_blocked_command_port_shows_unavailable_with_live_links(self, cluster: SimCluster) -> None:
        """block_cmd on tray 1: the other trays' -N show it UNAVAILABLE with every link INVALID, while
        their own links to it stay CONNECTED; tray 1 itself still sees everything UP."""
        cluster.start(0)
        cluster.start(1, faults="block_cmd")
        cluster.start(2)
        cluster.wait_up(1)

        def blocked_view() -> Any:
            snap = cluster.domain(0)
            ok = snap is not None and snap["nodes"]["0"]["connections"]["1"]["status"] == "CONNECTED"
            return snap if ok else None

        snap = wait_for(blocked_view, what="tray 0 connected to tray 1")
        node1 = snap["nodes"]["1"]
        assert node1["status"] == "UNAVAILABLE" and {c["status"] for c in node1["connections"].values()} == {"INVALID"}
        assert snap["status"] == "DEGRADED"
        assert snap["nodes"]["2"]["connections"]["1"]["status"] == "CONNECTED"


class TestFailures:
    def test_map_mismatch(self, cluster: SimCluster) -> None:
        """Different nodes files show !M! both ways and the domain never comes UP."""
        other = cluster.write("other.cfg", f"{cluster.addresses[1]}\n{cluster.addresses[0]}\n")
        cluster.start(0)
        cluster.start(1, IMEX_NODE_CONFIG_FILE=other)
        wait_for(lambda: cluster.link(0, 0, 1) == "NODE_MAP_MISMATCH", what="!M! on tray 0")
        # tray 1's file is reversed, so there it is node 0 and tray 0 is node 1
        wait_for(lambda: cluster.link(1, 0, 1) == "NODE_MAP_MISMATCH", what="!M! on tray 1")
        snap = cluster.domain(0)
        assert snap is not None and snap["status"] != "UP"
        assert "Node configuration mapping mismatch" in cluster.log_text(0)
        text = cluster.ctl("-c", str(cluster.dir / "c0.cfg"), "-N").stdout
        assert "       0        C   !M!" in text

    def test_version_mismatch(self, cluster: SimCluster) -> None:
        """A version fault on one tray shows !V! and keeps the domain from UP."""
        cluster.start(0)
        cluster.start(1, faults=f"@{cluster.addresses[1]} version=570.172")
        wait_for(lambda: cluster.link(0, 0, 1) == "VERSION_MISMATCH", what="!V! on tray 0")
        wait_for(lambda: cluster.link(1, 1, 0) == "VERSION_MISMATCH", what="!V! on tray 1")
        snap = cluster.domain(1)
        assert snap is not None and snap["status"] != "UP"
        assert snap["nodes"]["1"]["version"] == "570.172"

    def test_never_ready(self, cluster: SimCluster) -> None:
        """never_ready keeps a tray WAITING_FOR_PEERS while its links connect; the domain stays DEGRADED."""
        cluster.start(0)
        cluster.start(1, faults="never_ready")
        wait_for(lambda: cluster.link(0, 1, 0) == "CONNECTED", what="tray 1 connected")
        assert cluster.state(1) == "WAITING_FOR_PEERS"
        snap = cluster.domain(0)
        assert snap is not None and (snap["status"], snap["nodes"]["1"]["status"]) == ("DEGRADED", "WAITING_FOR_PEERS")
        q = cluster.ctl("-c", str(cluster.dir / "c1.cfg"), "-q")
        assert (q.returncode, q.stdout) == (0, "WAITING_FOR_PEERS\n")

    def test_slow_start(self, cluster: SimCluster) -> None:
        """slow_start holds INITIALIZING (domain DOWN locally), then the tray becomes READY."""
        cluster.start(0, faults="slow_start=2.5")
        assert wait_for(lambda: cluster.state(0), what="an answer") == "INITIALIZING"
        snap = cluster.domain(0)
        assert snap is not None and snap["status"] == "DOWN"
        wait_for(lambda: cluster.state(0) == "READY", what="READY after slow start")

    def test_full_quorum_waits_for_all(self, cluster: SimCluster) -> None:
        """IMEX_WAIT_FOR_QUORUM=FULL stays WAITING_FOR_PEERS until every node is connected."""
        cluster.start(0, IMEX_WAIT_FOR_QUORUM="FULL")
        wait_for(lambda: cluster.link(0, 0, 0) == "CONNECTED", what="self link")
        assert cluster.state(0) == "WAITING_FOR_PEERS"
        cluster.start(1)
        wait_for(lambda: cluster.state(0) == "READY", what="READY once tray 1 is there")

    def test_crash_after(self, cluster: SimCluster) -> None:
        """crash_after exits 134 without notice; peers show it UNAVAILABLE with INVALID links."""
        cluster.start(0)
        crashing = cluster.start(1, faults=f"@{cluster.addresses[1]} crash_after=3.0")
        wait_for(lambda: cluster.link(0, 0, 1) == "CONNECTED", what="tray 1 connected before its crash")
        assert _exit_code(crashing) == 134
        wait_for(
            lambda: (cluster.domain(0) or {}).get("nodes", {}).get("1", {}).get("status") == "UNAVAILABLE",
            what="tray 1 UNAVAILABLE",
        )
        d = parse_domain_json(json.dumps(cluster.domain(0)))
        assert d.status == "DEGRADED"
        assert d.not_connected() == [(0, 1, "RECOVERING"), (1, 0, "INVALID")]
        assert "Received notification of shutdown" not in cluster.log_text(0)
        assert os.path.exists(cluster.sock(1)), "a crash leaves the socket file behind"

    def test_refuse_peer(self, cluster: SimCluster) -> None:
        """refuse_peer keeps both directions NEVER_CONNECTED."""
        cluster.start(0, faults=f"@{cluster.addresses[0]} refuse_peer={cluster.addresses[1]}")
        cluster.start(1)
        wait_for(lambda: cluster.link(0, 0, 0) == "CONNECTED", what="tray 0 up")
        wait_for(lambda: cluster.link(1, 1, 1) == "CONNECTED", what="tray 1 up")
        wait_for(lambda: "Attempting connection for target node 0" in cluster.log_text(1), what="attempt")
        assert (cluster.link(0, 0, 1), cluster.link(1, 1, 0)) == ("NEVER_CONNECTED", "NEVER_CONNECTED")


class TestSignals:
    def test_sigterm(self, cluster: SimCluster) -> None:
        """SIGTERM exits 0 within a second, removes the socket, and peers see the node go."""
        cluster.start_all()
        cluster.wait_up(0)
        cluster.procs[1].send_signal(signal.SIGTERM)
        assert _exit_code(cluster.procs[1]) == 0  # within _exit_code's 10 s: a shutdown that hangs fails here
        # the shutdown itself, from the signal's handler to its end, as the simulator logs it (the process's own
        # start and exit are the machine's, not the shutdown's): its one wait is the peers' notice
        # (SHUTDOWN_NOTIFY_S, 0.3 s); a second is what the tests' hooks give a daemon before SIGKILL
        # (stop_timeout_s = 1 in tests/conftest.py)
        took = re.search(r"Simulator: shutdown took ([0-9.]+) s", cluster.log_text(1))
        assert took is not None and float(took.group(1)) < 1.0, cluster.log_text(1)[-2000:]
        assert not os.path.exists(cluster.sock(1))
        wait_for(lambda: "Received notification of shutdown from node 1" in cluster.log_text(0), what="notice")
        wait_for(lambda: cluster.link(0, 0, 1) == "RECOVERING", what="R on tray 0")
        snap = cluster.domain(0)
        assert snap is not None and snap["nodes"]["1"]["status"] == "UNAVAILABLE"

    def test_restarted_peer_rejoins(self, cluster: SimCluster) -> None:
        """A peer stopped and started again is seen as a new instance and the domain is UP again."""
        cluster.start_all()
        cluster.wait_up(0)
        cluster.procs[1].send_signal(signal.SIGTERM)
        assert _exit_code(cluster.procs[1]) == 0
        wait_for(lambda: cluster.link(0, 0, 1) == "RECOVERING", what="R on tray 0")
        cluster.start(1)
        cluster.wait_up(0)
        log = cluster.log_text(0)
        assert "Node 1 reconnected as a new IMEX instance" in log
        assert f"node 1 with ip address {cluster.addresses[1]}. Number of times connected: 2" in log

    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT], ids=["SIGINT", "SIGQUIT"])
    def test_other_stop_signals(self, cluster: SimCluster, sig: signal.Signals) -> None:
        """SIGINT and SIGQUIT stop the daemon cleanly too."""
        cluster.start(0)
        wait_for(lambda: cluster.state(0) == "READY", what="READY")
        cluster.procs[0].send_signal(sig)
        assert _exit_code(cluster.procs[0]) == 0

    def test_grace_time_zero_disconnects(self, cluster: SimCluster) -> None:
        """With IMEX_NODE_DISCONNECTED_GRACE_TIME=0 a lost peer goes straight to DISCONNECTED."""
        cluster.start(0, IMEX_NODE_DISCONNECTED_GRACE_TIME=0)
        cluster.start(1)
        cluster.wait_up(0)
        cluster.procs[1].send_signal(signal.SIGTERM)
        wait_for(lambda: cluster.link(0, 0, 1) == "DISCONNECTED", what="D on tray 0")

    def test_sigusr1_rate_limited(self, cluster: SimCluster) -> None:
        """SIGUSR1 reconnects every outgoing link once; a second one within 5 s is ignored."""
        cluster.start_all()
        cluster.wait_up(0)
        cluster.procs[0].send_signal(signal.SIGUSR1)
        wait_for(lambda: "Received SIGUSR1" in cluster.log_text(0), what="first SIGUSR1")
        cluster.procs[0].send_signal(signal.SIGUSR1)
        wait_for(lambda: "Ignoring SIGUSR1" in cluster.log_text(0), what="second SIGUSR1 ignored")
        again = f"node 1 with ip address {cluster.addresses[1]}. Number of times connected: 2"
        wait_for(lambda: again in cluster.log_text(0), what="reconnect")
        log = cluster.log_text(0)
        assert (log.count("Received SIGUSR1"), log.count("Ignoring SIGUSR1")) == (1, 1)
        assert "Number of times connected: 3" not in log
        cluster.wait_up(0)

    def test_sighup_only_logs(self, cluster: SimCluster) -> None:
        """SIGHUP writes a log line and the daemon keeps serving."""
        cluster.start(0)
        wait_for(lambda: cluster.state(0) == "READY", what="READY")
        cluster.procs[0].send_signal(signal.SIGHUP)
        wait_for(lambda: "Received SIGHUP" in cluster.log_text(0), what="log line")
        assert cluster.state(0) == "READY"


class TestStartup:
    def test_daemonize_parent_exits_after_bind(self, cluster: SimCluster) -> None:
        """DAEMONIZE=1: the parent exits 0 with its pipes closed, the child serves on."""
        cfg = cluster.config(0, DAEMONIZE=1)
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(), capture_output=True, text=True, timeout=15)
        assert (done.returncode, done.stderr) == (0, "")
        assert wait_for(lambda: cluster.state(0) == "READY" and "READY", what="child READY") == "READY"
        children = cluster.ours()
        assert len(children) == 1 and children[0].ppid() != os.getpid()
        children[0].send_signal(signal.SIGTERM)
        wait_for(lambda: not os.path.exists(cluster.sock(0)), what="clean exit of the child")

    def test_daemonize_reports_init_failure(self, cluster: SimCluster) -> None:
        """DAEMONIZE=1 with a port already taken: the command exits 1 and no child stays behind."""
        cluster.start(0)
        wait_for(lambda: cluster.state(0) == "READY", what="first daemon")
        cfg = cluster.write(
            "dup.cfg",
            cluster.config(
                0, DAEMONIZE=1, IMEX_CMD_UNIX_DOMAIN_PATH=cluster.sock(9), LOG_FILE_NAME=cluster.dir / "dup.log"
            ).read_text(),
        )
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(), capture_output=True, text=True, timeout=15)
        assert done.returncode == 1 and "Address already in use" in done.stderr
        assert len(cluster.ours()) == 1

    def test_address_in_use(self, cluster: SimCluster) -> None:
        """A second daemon on a held SERVER_PORT logs 'Address already in use' and exits 1."""
        cluster.start(0)
        wait_for(lambda: cluster.state(0) == "READY", what="first daemon")
        cfg = cluster.write(
            "dup.cfg", cluster.config(0, IMEX_CMD_UNIX_DOMAIN_PATH=cluster.sock(9), LOG_FILE_NAME="").read_text()
        )
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(), capture_output=True, text=True, timeout=15)
        assert done.returncode == 1
        assert (
            f"Failed to bind IMEX server to {cluster.addresses[0]}:{cluster.port}: Address already in use"
            in done.stderr
        )
        assert "[ERROR]" in done.stderr

    def test_live_unix_socket_is_not_stolen(self, cluster: SimCluster) -> None:
        """A command socket a live daemon serves is refused, not replaced."""
        cluster.start(0)
        wait_for(lambda: cluster.state(0) == "READY", what="first daemon")
        other_port = free_port(cluster.addresses[:1])
        other_cmd = free_port(cluster.addresses[:1], avoid=other_port)
        cfg = cluster.write(
            "dup.cfg", cluster.config(0, SERVER_PORT=other_port, IMEX_CMD_PORT=other_cmd, LOG_FILE_NAME="").read_text()
        )
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(), capture_output=True, text=True, timeout=15)
        assert done.returncode == 1 and f"{cluster.sock(0)}: Address already in use" in done.stderr
        assert cluster.state(0) == "READY"

    @pytest.mark.parametrize(
        ("nodes", "message"),
        [
            pytest.param(None, "Failed to read node configuration file", id="unreadable-nodes-file"),
            pytest.param("127.0.0.1\n\n127.0.0.2\n", "invalid entry '' on line 2", id="blank-line"),
            pytest.param(
                "192.0.2.7\n",
                "No matching network interface found for any IP addresses in the node configuration file",
                id="no-own-address",
            ),
        ],
    )
    def test_bad_nodes_file(self, cluster: SimCluster, nodes: str | None, message: str) -> None:
        """Nodes-file problems are logged with the real messages and the daemon exits 1."""
        path = cluster.dir / "missing.cfg" if nodes is None else cluster.write("bad.cfg", nodes)
        cfg = cluster.config(0, IMEX_NODE_CONFIG_FILE=path, BIND_INTERFACE_IP="", LOG_FILE_NAME="")
        done = subprocess.run(
            cluster.argv(cfg),
            env=cluster.env(extra={"IMEX_SIM_LOCAL_ADDRS": "127.0.0.1"}),
            capture_output=True,
            text=True,
            timeout=15,
        )
        assert done.returncode == 1 and message in done.stderr

    def test_bind_ip_not_in_nodes_file(self, cluster: SimCluster) -> None:
        """A BIND_INTERFACE_IP that is not in the nodes file is refused."""
        cfg = cluster.config(0, BIND_INTERFACE_IP="127.0.0.253", LOG_FILE_NAME="")
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(), capture_output=True, text=True, timeout=15)
        assert done.returncode == 1 and "BIND_INTERFACE_IP '127.0.0.253' does not match" in done.stderr

    @pytest.mark.parametrize(
        ("faults", "message"),
        [
            pytest.param("explode", "unknown fault 'explode'", id="unknown"),
            pytest.param("crash_after=later", "crash_after='later'", id="bad-value"),
        ],
    )
    def test_bad_faults_refuse_to_start(self, cluster: SimCluster, faults: str, message: str) -> None:
        """An unknown or malformed fault switch stops start-up with exit 1."""
        cfg = cluster.config(0, LOG_FILE_NAME="")
        done = subprocess.run(cluster.argv(cfg), env=cluster.env(faults), capture_output=True, text=True, timeout=15)
        assert done.returncode == 1 and message in done.stderr

    def test_faults_file(self, cluster: SimCluster) -> None:
        """The file named by the environment variable IMEX_SIM_FAULTS_FILE is read like IMEX_SIM_FAULTS."""
        faults = cluster.write("faults.txt", f"# test\n@{cluster.addresses[0]} hostname=from-file\n")
        cluster.start(0, env={"IMEX_SIM_FAULTS_FILE": str(faults)})
        wait_for(lambda: cluster.state(0) == "READY", what="READY")
        snap = cluster.domain(0)
        assert snap is not None and snap["nodes"]["0"]["hostName"] == "from-file"

    def test_faults_never_come_from_the_config(self, cluster: SimCluster) -> None:
        """A fault file named in config.cfg (which imexctl owns) is an unknown key, logged and ignored."""
        faults = cluster.write("faults.txt", "never_ready\n")
        cluster.start(0, IMEX_SIM_FAULTS_FILE=faults)
        wait_for(lambda: cluster.state(0) == "READY", what="READY despite the config key")
        assert "Ignoring unknown configuration key IMEX_SIM_FAULTS_FILE" in cluster.log_text(0)

    def test_nogpu_and_port_option(self, cluster: SimCluster) -> None:
        """--nogpu reports version NO_GPU and -p overrides SERVER_PORT."""
        cluster.write("nodes.cfg", f"{cluster.addresses[0]}\n")
        port = free_port(cluster.addresses[:1])
        cluster.start(0, args=["--nogpu", "-p", str(port)], SERVER_PORT=1)
        snap = cluster.wait_up(0)
        assert snap["nodes"]["0"]["version"] == "NO_GPU"
        assert f"bind port = {port}" in cluster.log_text(0)

    def test_inherited_fds_are_closed(self, cluster: SimCluster) -> None:
        """A descriptor inherited from the caller (a prolog's pipe) is not kept open."""
        rfd, wfd = os.pipe()
        try:
            proc = subprocess.Popen(
                cluster.argv(cluster.config(0)), env=cluster.env(), pass_fds=(wfd,), stderr=subprocess.DEVNULL
            )
            cluster.procs[0] = proc  # type: ignore[assignment]
            wait_for(lambda: cluster.state(0) == "READY", what="READY")
            pipe_inode = os.fstat(wfd).st_ino
            held = [f for f in os.listdir(f"/proc/{proc.pid}/fd") if _inode(f"/proc/{proc.pid}/fd/{f}") == pipe_inode]
            assert held == []
        finally:
            os.close(rfd)
            os.close(wfd)


def _inode(fd_link: str) -> int | None:
    """The inode a ``/proc/<pid>/fd`` entry names; None for a descriptor closed since it was listed (a peer's
    socket the daemon dropped meanwhile: a full run of the suite failed on it once)."""
    try:
        return os.stat(fd_link).st_ino
    except FileNotFoundError:
        return None


class TestCtl:
    def test_unreadable_nodes_file_exits_255(self, cluster: SimCluster) -> None:
        """-c with an unreadable nodes file prints 'Failed to read node configuration file' and exits 255."""
        missing = cluster.dir / "nope.cfg"
        cfg = str(cluster.config(0, IMEX_NODE_CONFIG_FILE=missing))
        for args in (["-q"], ["-N"], ["-N", "-j"]):
            done = cluster.ctl("-c", cfg, *args)
            assert (255, f"Failed to read node configuration file {missing}\n") == (done.returncode, done.stdout)

    def test_no_daemon(self, cluster: SimCluster) -> None:
        """Without a daemon: -q prints UNAVAILABLE (exit 1); -N shows every node UNAVAILABLE, DOWN (exit 0);
        -N without the config is a usage error (it needs the nodes file and the command port)."""
        cfg = str(cluster.config(0))
        q = cluster.ctl("-c", cfg, "-q")
        assert (q.returncode, q.stdout) == (1, "UNAVAILABLE\n")
        n = cluster.ctl("-c", cfg, "-N", "-j")
        d = parse_domain_json(n.stdout)
        assert (n.returncode, d.status) == (0, "DOWN")
        assert {"UNAVAILABLE"} == {node.status for node in d.nodes}
        u = cluster.ctl("-u", cluster.sock(0), "-N")
        assert (u.returncode, u.stdout) == (2, "") and "-N requires the config file" in u.stderr

    def test_hang_ctl_needs_timeout(self, cluster: SimCluster) -> None:
        """hang_ctl never answers: -t bounds the ctl, without -t it waits until killed."""
        cluster.start(0, faults="hang_ctl")
        wait_for(lambda: os.path.exists(cluster.sock(0)), what="socket")
        started = time.monotonic()
        done = cluster.ctl("-u", cluster.sock(0), "-q", "-t", "300")
        assert (done.returncode, done.stdout) == (1, "UNAVAILABLE\n") and "timed out" in done.stderr
        # -t 300 (ms) ended the wait ("timed out" above); without it the ctl waits until killed (below): the
        # bound tells a bounded ctl from a hung one, with a loaded machine's margin
        assert time.monotonic() - started < 30.0
        with pytest.raises(subprocess.TimeoutExpired):
            cluster.ctl("-u", cluster.sock(0), "-q", timeout=0.7)

    def test_console_scripts_match_modules(self) -> None:
        """setup.cfg's console scripts point at the two main() functions."""
        from configparser import ConfigParser
        from pathlib import Path

        parser = ConfigParser()
        parser.read(Path(__file__).parents[2] / "setup.cfg")
        scripts = parser["options.entry_points"]["console_scripts"]
        assert "nvidia-imex-sim = imexctl.sim.daemon:main" in scripts
        assert "nvidia-imex-ctl-sim = imexctl.sim.ctl:main" in scripts

    def test_ctl_imports_stay_light(self) -> None:
        """Importing the ctl pulls in neither asyncio nor psutil."""
        code = "import sys, imexctl.sim.ctl; print(sorted(m for m in ('asyncio', 'psutil') if m in sys.modules))"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": str(REPO)}
        )
        assert out.stdout == "[]\n"
