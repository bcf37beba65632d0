"""RealHost's view of a process, read from /proc without psutil, against psutil's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from imexctl.platform.errors import CommandError
from imexctl.platform.host import RealHost, split_cmdline


@pytest.mark.parametrize(
    ("data", "argv"),
    [
        pytest.param("/usr/bin/nvidia-imex\0-c\0/run/j.cfg\0", ("/usr/bin/nvidia-imex", "-c", "/run/j.cfg"), id="nul"),
        pytest.param("a\0\0b\0", ("a", "", "b"), id="empty-arg"),
        pytest.param("worker: idle job 7", ("worker:", "idle", "job", "7"), id="retitled-blanks"),
        pytest.param("worker: idle job 7\0", ("worker:", "idle", "job", "7"), id="retitled-final-nul"),
        pytest.param("one\0", ("one",), id="one-arg"),
        pytest.param("", (), id="kernel-thread"),
    ],
)
def test_split_cmdline_like_psutil(data: str, argv: tuple[str, ...]) -> None:
    """The argv is split at NUL bytes, or at blanks for a process that rewrote its title (psutil issue #1179)."""
    assert split_cmdline(data) == argv


def test_info_matches_psutil() -> None:
    """pid, argv, process group and session of a live child are what psutil reports."""
    code = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code, "two words"], stdout=subprocess.PIPE)
    try:
        # Popen returns once the exec closed its pipe, before the kernel has set the new command line's
        # bounds: read in that window, /proc/<pid>/cmdline is empty (seen under load). The child's own
        # line says it runs.
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        info = RealHost._info(child.pid)
        p = psutil.Process(child.pid)
        assert info is not None
        want = (child.pid, tuple(p.cmdline()), os.getpgid(0), os.getsid(0))
        assert (info.pid, info.cmdline, info.pgid, info.sid) == want
        assert 0 <= time.clock_gettime(time.CLOCK_BOOTTIME) - info.create_time < 30
        assert RealHost().is_alive(info)
    finally:
        child.kill()
        child.wait()
    assert RealHost._info(child.pid) is None and not RealHost().is_alive(info)


def test_zombie_is_not_alive() -> None:
    """A child that exited but was not reaped yet is no live process (psutil's STATUS_ZOMBIE)."""
    child = subprocess.Popen(["/bin/true"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert RealHost._info(child.pid) is None
    finally:
        child.wait()


def test_another_process_with_the_same_pid_is_not_alive() -> None:
    """A process is known by pid and start time: a different start time means another process."""
    info = RealHost._info(os.getpid())
    assert info is not None and RealHost().is_alive(info)
    assert not RealHost().is_alive(info._replace(create_time=info.create_time + 1))


def test_processes_with_arg_finds_what_psutil_finds(tmp_path: Path) -> None:
    """Exact and prefix matches of one argv element, as psutil's cmdline() splits it; substrings are no match."""
    arg = str(tmp_path / "run/imexctl/jobs/7/config.cfg")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-c", arg])
    try:
        deadline = time.monotonic() + 10
        while arg not in psutil.Process(child.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        host = RealHost()
        assert [p.pid for p in host.processes_with_arg(arg)] == [child.pid]
        assert [p.pid for p in host.processes_with_arg(str(tmp_path / "run/imexctl/jobs/"), prefix=True)] == [child.pid]
        assert host.processes_with_arg(str(tmp_path / "run/imexctl/jobs/")) == []  # not an element
        assert host.processes_with_arg("jobs/7/config.cfg", prefix=True) == []  # inside an element, not its start
        (found,) = host.processes_with_arg(arg)
        assert found.cmdline == tuple(psutil.Process(child.pid).cmdline())
    finally:
        child.kill()
        child.wait()
    assert RealHost().processes_with_arg(arg) == []


def test_processes_with_arg_leaves_out_zombies(tmp_path: Path) -> None:
    """A child that exited but was not reaped yet is not listed."""
    arg = str(tmp_path / "zombie-marker")
    # it lives until we close its stdin: listed for as long as the test looks, however loaded the machine
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", arg], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while arg.encode() not in Path(f"/proc/{child.pid}/cmdline").read_bytes():  # the exec is still loading
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert [p.pid for p in RealHost().processes_with_arg(arg)] == [child.pid]
        assert child.stdin is not None
        child.stdin.close()
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert RealHost().processes_with_arg(arg) == []
    finally:
        child.wait()


def test_spawn_detached_returns_once_the_command_line_shows(tmp_path: Path) -> None:
    """Right after spawn the daemon is found by its command line: the roll-back and the liveness check rely on it.

    Popen returns before the kernel shows the new command line (an empty
    /proc/<pid>/cmdline for a moment); spawn_detached waits for it.  The
    window is widest on a busy machine: three busy processes run meanwhile
    (without the wait, 52 of 200 spawns here came back without it).
    """
    host, marker = RealHost(), str(tmp_path / "spawn-marker")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    seen: list[tuple[str, ...]] = []
    try:
        for _ in range(60):
            argv = [sys.executable, "-c", "import time; time.sleep(30)", marker]
            info = host.spawn_detached(argv, log_path=tmp_path / "log")
            seen.append(info.cmdline)
            os.kill(info.pid, signal.SIGKILL)  # not waited for: the next spawn runs while it goes
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert [c for c in seen if marker not in c] == []
    deadline = time.monotonic() + 10
    while host.processes_with_arg(marker) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_tcp_reach_tells_open_from_refused() -> None:
    """A listening port is ``open``, a closed one ``refused``; both answered within the timeout."""
    import socket

    from imexctl.platform.host import RealHost

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        closed.bind(("127.0.0.2", 0))  # bound, never listening: the port refuses
        port = listening.getsockname()[1]
        closed_port = closed.getsockname()[1]
        assert RealHost().tcp_reach(["127.0.0.1"], port, 2.0) == {"127.0.0.1": "open"}
        assert RealHost().tcp_reach(["127.0.0.2"], closed_port, 2.0) == {"127.0.0.2": "refused"}


@pytest.mark.parametrize("family", ["inet", "inet6-dual-stack"])
def test_tcp_links_names_who_is_connected_both_ways(family: str) -> None:
    """Incoming: the remote end of each established connection to address:port (a dual-stack listener's IPv4
    peers too, tcp6); outgoing: whose port address is connected to. Not a listener, another address or port."""
    import socket

    from imexctl.platform.host import RealHost

    if family == "inet":
        server = socket.socket()
        server.bind(("127.0.0.11", 0))
    else:
        server = socket.socket(socket.AF_INET6)
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind(("::", 0))
    clients = [socket.socket(), socket.socket()]
    with server, clients[0], clients[1]:
        server.listen(4)
        port = server.getsockname()[1]
        assert RealHost().tcp_links("127.0.0.11", port) == (frozenset(), frozenset())  # listening only
        for client, source in zip(clients, ("127.0.0.12", "127.0.0.13")):
            client.bind((source, 0))
            client.connect(("127.0.0.11", port))
        accepted = [server.accept()[0] for _ in clients]
        try:
            assert RealHost().tcp_links("127.0.0.11", port) == (frozenset({"127.0.0.12", "127.0.0.13"}), frozenset())
            assert RealHost().tcp_links("127.0.0.12", port) == (frozenset(), frozenset({"127.0.0.11"}))
            assert RealHost().tcp_links("127.0.0.11", port + 1) == (frozenset(), frozenset())
        finally:
            for conn in accepted:
                conn.close()


def test_resolve_gives_each_address_once_in_resolver_order() -> None:
    """localhost resolves (through _socket, as socket.getaddrinfo would) to loopback addresses, no repeats."""
    found = RealHost().resolve("localhost")
    assert found and set(found) <= {"127.0.0.1", "::1"} and len(found) == len(set(found))


def test_an_unresolvable_name_is_a_command_error_naming_it() -> None:
    """A name refused before any query is sent (a 64-character label: IDNA's limit is 63) names itself."""
    name = "g" * 64 + ".example"
    with pytest.raises(CommandError, match=f"cannot resolve '{name}'"):
        RealHost().resolve(name)


def test_is_local_address_tells_own_from_foreign_in_both_families() -> None:
    """Loopback binds; a documentation address (RFC 5737, RFC 3849) is on no interface here."""
    host = RealHost()
    assert host.is_local_address("127.0.0.1") and not host.is_local_address("192.0.2.1")
    inet6 = Path("/proc/net/if_inet6")
    if inet6.exists() and "0" * 31 + "1" in inet6.read_text():  # ::1 is up
        assert host.is_local_address("::1") and not host.is_local_address("2001:db8::1")


def test_port_in_use_sees_a_listener_and_not_a_foreign_address() -> None:
    """A bound listener makes its port in use; an address of no interface is not in use.

    (Not "free once closed": another process of a loaded machine may take the port in between.)
    """
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert RealHost().port_in_use("127.0.0.1", port)
        assert not RealHost().port_in_use("192.0.2.1", port)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creating a device node and giving it to another uid")
def test_mknod_char_gives_the_node_to_the_uid_and_the_gid_each_in_its_place(tmp_path: Path) -> None:
    """The channel node is the job's user's and the job's group's, never the other way round (uid != gid)."""
    import stat

    path = tmp_path / "channel7"
    RealHost().mknod_char(path, 234, 7, mode=0o600, uid=4242, gid=4343)
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (234, 7)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4242, 4343, 0o600)


def _zombie(argv: list[str]) -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped yet (state Z): what spawn finds of a daemon that exits at once."""
    child = subprocess.Popen(argv)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
        assert time.monotonic() < deadline, f"{argv} did not exit"
        time.sleep(0.005)
    return child


def test_a_daemon_that_exits_at_once_comes_back_with_its_own_start_time() -> None:
    """spawn's answer for a process that is already a zombie is its start from /proc, never 0.0 (which would
    make any later process with that pid pass for it)."""
    child = _zombie(["/bin/true"])
    try:
        info = RealHost()._once_visible(child.pid, ("/bin/true",))
        start = int(Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
        assert info.create_time > 0 and info.create_time == start / os.sysconf("SC_CLK_TCK"), info
    finally:
        child.wait()


def test_a_pid_without_a_start_time_is_no_process() -> None:
    """ProcInfo(pid, 0.0): is_alive says no and send_signal sends nothing, whoever has the pid."""
    from imexctl.platform.host import ProcInfo

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        unknown = ProcInfo(child.pid, 0.0, ())
        assert not RealHost().is_alive(unknown)
        RealHost().send_signal(unknown, signal.SIGKILL)
        time.sleep(0.05)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a file under /dev and a process of another uid")
def test_driver_clients_are_the_uids_processes_holding_a_dev_nvidia_file(tmp_path: Path) -> None:
    """A process of the uid with a /dev/nvidia* file open is one; the same uid without it, or root with it, not."""
    dev = Path(f"/dev/nvidia-imexctl-test-{os.getpid()}")
    dev.write_text("")
    dev.chmod(0o644)
    hold = "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(60)"
    idle = "import time; print('open', flush=True); time.sleep(60)"
    kids = []
    try:
        for code, user in ((hold, 65534), (idle, 65534), (hold, 0)):
            kid = subprocess.Popen([sys.executable, "-c", code, str(dev)], user=user, stdout=subprocess.PIPE, text=True)
            assert kid.stdout is not None and kid.stdout.readline() == "open\n"
            kids.append(kid)
        found = RealHost().driver_clients(65534)
        assert [p.pid for p in found] == [kids[0].pid] and found[0].uid == 65534
        assert kids[2].pid in [p.pid for p in RealHost().driver_clients(0)]
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
        dev.unlink()
    assert not [p for p in RealHost().driver_clients(65534) if p.pid in {k.pid for k in kids}]
