"""Who holds a TCP port, from the kernel's socket tables and the processes' descriptors (issue 41).

``read_tcp_sockets`` reads ``/proc/net/tcp`` and ``tcp6`` and follows each
socket's inode to the process whose ``/proc/<pid>/fd`` links to it.  The
tests build such a tree under ``tmp_path`` (the kernel's text formats: proc(5)),
and one asks the real kernel about a socket of this very process.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from imexctl.platform import procscan
from imexctl.platform.host import RealHost, TcpSocket, read_tcp_sockets

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
LISTEN, ESTABLISHED, TIME_WAIT = "0A", "01", "06"


def _hex(address: str, port: int) -> str:
    """``address:port`` as the kernel prints it: each 32-bit word of the address in host byte order."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    words = [raw[i : i + 4][::-1] if sys.byteorder == "little" else raw[i : i + 4] for i in range(0, len(raw), 4)]
    return f"{b''.join(words).hex().upper()}:{port:04X}"


def _line(address: str, port: int, *, st: str = LISTEN, uid: int = 0, inode: int = 0, n: int = 0) -> str:
    remote = _hex("::" if ":" in address else "0.0.0.0", 0)
    return f"{n:4}: {_hex(address, port)} {remote} {st} 00000000:00000000 00:00000000 00000000 {uid:5} 0 {inode} 1\n"


class Tree:
    """A /proc of our own: the two socket tables, processes with descriptors, an /etc/passwd."""

    def __init__(self, top: Path) -> None:
        self.proc, self.passwd = top / "proc", top / "passwd"
        (self.proc / "net").mkdir(parents=True)
        self.tcp: list[str] = []
        self.tcp6: list[str] = []
        self.passwd.write_text("root:x:0:0:root:/root:/bin/sh\nimexlab:x:1501:1502::/home/imexlab:/bin/sh\n")

    def socket(self, address: str, port: int, **kw: int | str) -> None:
        """A socket in the table of its family (an IPv4-mapped address in tcp6, as a dual-stack socket's)."""
        table = self.tcp6 if ":" in address else self.tcp
        table.append(_line(address, port, n=len(table), **kw))  # type: ignore[arg-type]

    def process(self, pid: int, argv: list[str], *, uid: int, fds: dict[int, str], exe: str = "") -> None:
        """``/proc/<pid>``: its owner's uid in status, its command line, its descriptors' links, its executable."""
        d = self.proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "cmdline").write_bytes(b"".join(os.fsencode(a) + b"\0" for a in argv))
        for fd, target in fds.items():
            (d / "fd" / str(fd)).symlink_to(target)
        if exe:
            (d / "exe").symlink_to(exe)
        if os.geteuid() == 0:
            os.chown(d, uid, -1)

    def read(self, ports: set[int], address: str | None = None) -> list[TcpSocket] | None:
        (self.proc / "net/tcp").write_text(HEADER + "".join(self.tcp))
        (self.proc / "net/tcp6").write_text(HEADER + "".join(self.tcp6))
        return read_tcp_sockets(ports, address, proc=str(self.proc), passwd=str(self.passwd))


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def _holders(found: list[TcpSocket] | None) -> list[tuple[str, str, int | None, str]]:
    assert found is not None
    return [(s.address, s.state, s.holder.pid if s.holder else None, s.user) for s in found]


def test_an_ipv4_listener_on_the_address_and_its_process(tree: Tree) -> None:
    """The socket on 10.0.0.1:61042 and the process whose descriptor links to its inode: pid, uid, command, user."""
    tree.socket("10.0.0.1", 61042, uid=1501, inode=555)
    tree.process(4242, ["python3", "-m", "http.server", "61042"], uid=1501, fds={0: "/dev/null", 3: "socket:[555]"},
                 exe="/usr/bin/python3.11")  # fmt: skip
    (sock,) = tree.read({61042}, "10.0.0.1") or []
    assert (sock.address, sock.port, sock.state, sock.uid, sock.inode, sock.user) == (
        "10.0.0.1", 61042, "LISTEN", 1501, 555, "imexlab",
    )  # fmt: skip
    assert sock.holder is not None
    assert (sock.holder.pid, sock.holder.uid, sock.holder.cmdline, sock.holder.exe) == (
        4242, 1501, ("python3", "-m", "http.server", "61042"), "/usr/bin/python3.11",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("address", "shown"),
    [("0.0.0.0", "0.0.0.0"), ("::", "::"), ("::ffff:10.0.0.1", "10.0.0.1")],
    ids=["ipv4-wildcard", "ipv6-wildcard", "v4-mapped"],
)
def test_wildcards_and_v4_mapped_addresses_hold_the_trays_address(tree: Tree, address: str, shown: str) -> None:
    """A socket on any address (IPv4 or dual-stack IPv6), or on the tray's address written IPv4-mapped, counts."""
    tree.socket(address, 62042, uid=1501, inode=9)
    tree.process(4300, ["nc", "-l"], uid=1501, fds={5: "socket:[9]"})
    assert _holders(tree.read({62042}, "10.0.0.1")) == [(shown, "LISTEN", 4300, "imexlab")]


def test_another_address_or_port_or_a_time_wait_is_no_holder(tree: Tree) -> None:
    """A socket on another address of the tray, another port, or in TIME_WAIT holds nothing the prolog binds."""
    tree.socket("10.0.0.2", 61042, inode=1)
    tree.socket("fd00::1", 61042, inode=2)
    tree.socket("10.0.0.1", 61043, inode=3)
    tree.socket("10.0.0.1", 61042, st=TIME_WAIT, inode=0)
    assert tree.read({61042}, "10.0.0.1") == []
    assert [s.address for s in tree.read({61042}) or []] == ["10.0.0.2", "fd00::1"]


def test_several_sockets_listeners_first_then_the_address_before_a_wildcard(tree: Tree) -> None:
    """An accepted connection, a wildcard listener and one on the address: listeners first, the address's first."""
    tree.socket("10.0.0.1", 61042, st=ESTABLISHED, uid=1501, inode=11)
    tree.socket("0.0.0.0", 61042, uid=0, inode=12)
    tree.socket("10.0.0.1", 61042, uid=1501, inode=13)
    tree.process(10, ["/usr/sbin/svc"], uid=0, fds={3: "socket:[12]"})
    tree.process(20, ["srv"], uid=1501, fds={3: "socket:[13]", 4: "socket:[11]"})
    assert _holders(tree.read({61042}, "10.0.0.1")) == [
        ("10.0.0.1", "LISTEN", 20, "imexlab"),
        ("0.0.0.0", "LISTEN", 10, "root"),
        ("10.0.0.1", "ESTABLISHED", 20, "imexlab"),
    ]


def test_a_vanished_process_leaves_the_sockets_owner(tree: Tree) -> None:
    """The holder's descriptor was listed, its status is gone (it exited meanwhile): no holder, the table's uid."""
    tree.socket("10.0.0.1", 61042, uid=1501, inode=77)
    tree.process(31, ["gone"], uid=1501, fds={3: "socket:[77]"})
    (tree.proc / "31/status").unlink()
    (sock,) = tree.read({61042}, "10.0.0.1") or []
    assert (sock.holder, sock.uid, sock.user) == (None, 1501, "imexlab")


def test_unreadable_entries_are_passed_over(tree: Tree) -> None:
    """Malformed table lines, a process whose fd directory cannot be listed, a link that is no socket: skipped."""
    tree.tcp += ["garbage\n", "   9: ZZZZ:1F90 00000000:0000 0A 0 0 0 0 1501 0 1 1\n", "   8: 0100007F:1F90\n"]
    tree.socket("10.0.0.1", 61042, uid=1501, inode=88)
    (tree.proc / "40").mkdir()
    (tree.proc / "40/fd").write_text("not a directory")
    tree.process(41, ["a"], uid=1501, fds={1: "pipe:[88]", 2: "/tmp/socket:[88]"})
    tree.process(42, ["b"], uid=1501, fds={3: "socket:[88]"})
    assert _holders(tree.read({61042}, "10.0.0.1")) == [("10.0.0.1", "LISTEN", 42, "imexlab")]


def test_no_table_readable_is_none(tree: Tree) -> None:
    """Neither table (no /proc/net here): None, never an empty answer that would read as "nobody"."""
    assert read_tcp_sockets({61042}, proc=str(tree.proc / "missing"), passwd=str(tree.passwd)) is None


def test_a_uid_without_a_passwd_line_has_no_name(tree: Tree) -> None:
    """A user of a directory service is named by uid only: /etc/passwd is all that is read."""
    tree.socket("10.0.0.1", 61042, uid=70001, inode=5)
    tree.process(50, ["x"], uid=70001, fds={3: "socket:[5]"})
    (sock,) = tree.read({61042}, "10.0.0.1") or []
    assert sock.user == "" and sock.holder is not None and sock.holder.uid == 70001


@pytest.mark.skipif(os.geteuid() != 0, reason="the owner of /proc/<pid> is set by chown (root)")
def test_the_sockets_owners_processes_are_searched_first(tree: Tree) -> None:
    """Two processes share the socket (one inherited it): the owner's is named, and the search stops there."""
    tree.socket("10.0.0.1", 61042, uid=1501, inode=66)
    tree.process(1, ["init"], uid=0, fds={3: "socket:[66]"})
    tree.process(900, ["srv"], uid=1501, fds={3: "socket:[66]"})
    assert _holders(tree.read({61042}, "10.0.0.1")) == [("10.0.0.1", "LISTEN", 900, "imexlab")]


def test_the_search_reads_a_bounded_number_of_links(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``max_links`` descriptors in all the search gives up: a user's many descriptors cost a bound."""
    for pid in (60, 61):
        tree.process(pid, ["many"], uid=1501, fds=dict.fromkeys(range(50), "/dev/null"))
    tree.process(62, ["holder"], uid=1501, fds={3: "socket:[99]"})
    read: list[str] = []
    real = os.readlink

    def counted(path: str) -> str:
        read.append(path)
        return real(path)

    monkeypatch.setattr(procscan.os, "readlink", counted)
    assert procscan.socket_holders({98}, proc=str(tree.proc), max_links=30) == {}
    assert len(read) == 30
    read.clear()
    assert procscan.socket_holders({99}, proc=str(tree.proc)) == {99: 62} and len(read) <= 101


def test_the_real_kernel_names_this_process() -> None:
    """A listener of this very process on loopback: RealHost finds it in /proc/net/tcp and names our pid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        found = RealHost().tcp_sockets({port}, "127.0.0.1")
    assert found is not None
    assert [(x.address, x.port, x.state, x.uid) for x in found] == [("127.0.0.1", port, "LISTEN", os.geteuid())]
    assert found[0].holder is not None and found[0].holder.pid == os.getpid()
