"""Every effect imexctl has on the machine except plain files: the ``Host`` seam.

``RealHost`` is thin and makes no decisions; ``tests.support.fakes.FakeHost``
records calls and refuses what it does not know.  Foreign exceptions
(``OSError``, ``subprocess.TimeoutExpired``, ``psutil.Error``) do not leave
this module except as :class:`~imexctl.platform.errors.CommandError`.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import subprocess

from imexctl.platform import Record
from imexctl.platform.errors import CommandError, DeviceError
from imexctl.platform.procscan import CMDLINE_BYTES, read_cmdline, scan, socket_holders

__all__ = [
    "MAX_OUTPUT",
    "SAFE_ENV",
    "Completed",
    "Host",
    "ProcInfo",
    "RealHost",
    "TcpSocket",
    "read_tcp_sockets",
    "select_sockets",
    "split_cmdline",
]

# The environment of every child: slurmd gives hooks none worth passing on.
SAFE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Most bytes kept from one command (stdout and stderr together).  `nvidia-imex-ctl -N -j`
# for a full rack prints about 20 KB; a command that never stops printing must not fill memory.
MAX_OUTPUT = 4 * 1024 * 1024


class Completed(Record):
    """A finished command."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class ProcInfo(Record):
    """A live process, identified by ``(pid, create_time)`` against pid reuse.

    ``create_time`` is when the process started, in seconds since boot (the clock of
    :meth:`Host.since_boot`), not a wall-clock time: it never changes while the process
    lives, whatever happens to the wall clock.
    """

    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    pgid: int = 0
    sid: int = 0
    #: real user id (``/proc/<pid>/status``); -1 where not read.  Not part of the identity (==)
    uid: int = -1
    #: the executable as the kernel shows it (``/proc/<pid>/exe``); '' where not read or not shown
    exe: str = ""

    # the identity: the first five fields, pid to sid
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcInfo) and self[:5] == other[:5]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:5])


class TcpSocket(Record):
    """A TCP socket of the kernel's table (``/proc/net/tcp``, ``tcp6``), and the process found holding it."""

    #: its local address as the table gives it: ``10.0.0.1``, ``0.0.0.0``, ``::``, ``fd00::1``; an IPv4-mapped
    #: IPv6 address (``::ffff:10.0.0.1``, a dual-stack socket's) as its IPv4 address
    address: str
    port: int
    #: the TCP state: ``LISTEN``, ``ESTABLISHED``, ... (include/net/tcp_states.h)
    state: str
    #: the socket's owner: the table's ``uid`` column
    uid: int
    #: the inode that descriptors on the socket link to (``socket:[<inode>]``); 0 for none
    inode: int
    #: the process found with a descriptor on it (pid, command line, real uid, executable); None: none found
    holder: ProcInfo | None = None
    #: the name of the holder's uid (the socket's, without a holder) in ``/etc/passwd``; '' where it has none
    user: str = ""


class Host(Protocol):
    """Every effect imexctl has on the machine, except plain files under ``Paths``."""

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        """Run a command to completion: no shell, bounded, ``env`` added to :data:`SAFE_ENV`.

        Raises CommandError if it cannot run or times out.
        """

    def spawn_detached(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> ProcInfo:
        """Start a daemon in a new session, stdio on ``log_path``, ``env`` added to :data:`SAFE_ENV`.

        The answer's ``create_time`` is the kernel's start of that very process, even when it exited at
        once; 0.0 only when not even that could be read (then it must not be recorded: see ``is_alive``).
        """

    def resolve(self, name: str) -> list[str]:
        """Every address of a host name, in resolver order."""

    def mknod_char(self, path: Path, major: int, minor: int, *, mode: int, uid: int, gid: int) -> None:
        """Create a character device node with exactly this owner and mode."""

    def processes_with_arg(
        self, arg: str, *, prefix: bool = False, uids: Collection[int] | None = None
    ) -> list[ProcInfo]:
        """Live processes with an argv element equal to (or starting with) ``arg``, with their uid and exe.

        ``uids``: only processes whose ``/proc/<pid>`` one of them owns (``procscan.scan``).
        """

    def is_alive(self, proc: ProcInfo) -> bool:
        """Whether that very process (pid and start time) still runs."""

    def send_signal(self, proc: ProcInfo, signum: int) -> None:
        """Signal the process if it is still the same one."""

    def job_is_running(self, job_id: int) -> bool:
        """Whether the Slurm job still has anything on this node."""

    def driver_clients(self, uid: int) -> list[ProcInfo]:
        """Live processes of ``uid`` that hold a file of the NVIDIA driver (``/dev/nvidia*``) open."""

    def port_in_use(self, address: str, port: int) -> bool:
        """Whether a TCP listener could not bind ``address:port`` now."""

    def tcp_reach(self, addresses: Sequence[str], port: int, timeout_s: float) -> dict[str, str]:
        """Try a TCP connection to ``port`` on every address at once: ``open``, ``refused``, ``timeout`` or why."""

    def tcp_links(self, address: str, port: int) -> tuple[frozenset[str], frozenset[str]] | None:
        """Who has an established TCP connection to ``address:port``, and to whose ``port`` ``address`` has one."""

    def tcp_sockets(self, ports: Collection[int], address: str | None = None) -> list[TcpSocket] | None:
        """The TCP sockets on ``ports`` (bound to ``address`` or a wildcard, when given), each with its holder.

        From the kernel's tables (``/proc/net/tcp``, ``tcp6``; listeners first), the holder found by its
        inode in the processes' descriptors.  None when neither table can be read.
        """

    def is_local_address(self, address: str) -> bool:
        """Whether ``address`` is on one of this machine's interfaces (a daemon can bind it)."""

    def monotonic(self) -> float:
        """Monotonic clock, seconds."""

    def sleep(self, seconds: float) -> None:
        """Sleep."""

    def time(self) -> float:
        """Wall clock, seconds since the epoch."""

    def since_boot(self) -> float:
        """Seconds since boot, suspend included: the clock of ``ProcInfo.create_time``."""

    def euid(self) -> int:
        """Effective user id."""


class RealHost:
    """The production Host: every subprocess bounded, no shell, absolute argv[0]."""

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        """Run a command to completion with a timeout; never raises for a non-zero exit.

        Raises:
            CommandError: it cannot be started, does not finish within ``timeout_s``,
                or prints more than :data:`MAX_OUTPUT` bytes (it is killed then).
        """
        import subprocess

        argv = tuple(argv)
        try:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**SAFE_ENV, **(env or {})},
                close_fds=True,
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv
            raise CommandError(argv, f"cannot run: {getattr(exc, 'strerror', None) or exc}") from exc
        try:
            out, err, problem = _collect(p, timeout_s)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        if problem:
            raise CommandError(argv, problem, output=out)
        return Completed(argv, p.returncode, out, err)

    def spawn_detached(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> ProcInfo:
        """Start a daemon outside our session and process group, stdio on a log file.

        slurmd kills the hook's process group and reads its pipe until EOF
        (design.md source slurm-pgroup): the child gets a new session, ``/dev/null`` as stdin
        and the log file as stdout/stderr, and inherits no other descriptor.
        """
        import subprocess

        argv = tuple(argv)
        try:
            # O_NONBLOCK: a FIFO at the log's name would block the open until a reader came (issue 33)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(log_path, flags, 0o640)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise CommandError(argv, f"cannot start: {log_path} is not a regular file")
                p = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=fd,
                    start_new_session=True,
                    close_fds=True,
                    env={**SAFE_ENV, **(env or {})},
                    cwd="/",
                )
            finally:
                os.close(fd)
        except OSError as exc:
            raise CommandError(argv, f"cannot start: {exc.strerror} ({exc.filename or argv[0]})") from exc
        return self._once_visible(p.pid, argv)

    def _once_visible(self, pid: int, argv: tuple[str, ...]) -> ProcInfo:
        """The new process once ``/proc`` shows its command line (at most 1 s; at once if it already exited).

        Popen returns when the exec has begun, and the kernel sets the command
        line only once it has loaded the program: until then
        ``/proc/<pid>/cmdline`` is empty (3 reads in 4 right after Popen on
        this loaded 2-core machine).  Every later search for the daemon by its
        command line (the roll-back, the readiness probe's liveness check,
        status) would miss it.
        """
        deadline = time.monotonic() + 1.0
        while True:
            info = self._info(pid)
            if info is None:
                return ProcInfo(pid, _zombie_start(pid), argv)
            if info.cmdline or time.monotonic() >= deadline:
                return info
            time.sleep(0.001)

    def resolve(self, name: str) -> list[str]:
        """All addresses of ``name`` (IPv4 and IPv6), in resolver order, without repeats."""
        import _socket  # see _bind_errno

        try:
            infos = _socket.getaddrinfo(name, None, 0, _socket.SOCK_STREAM)
        except (_socket.gaierror, UnicodeError) as exc:
            raise CommandError(("getaddrinfo", name), f"cannot resolve {name!r}: {exc}") from exc
        out: list[str] = []
        for info in infos:
            addr = str(info[4][0]).split("%", 1)[0]
            if addr not in out:
                out.append(addr)
        return out

    def mknod_char(self, path: Path, major: int, minor: int, *, mode: int, uid: int, gid: int) -> None:
        """Create a character device node with exactly this owner and mode."""
        old = os.umask(0)
        try:
            # root-owned with the final mode first, then handed to the job's owner
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chown(path, uid, gid, follow_symlinks=False)
        except OSError as exc:
            raise DeviceError(f"mknod {path} c {major} {minor}: {exc.strerror}") from exc
        finally:
            os.umask(old)

    def processes_with_arg(
        self, arg: str, *, prefix: bool = False, uids: Collection[int] | None = None
    ) -> list[ProcInfo]:
        """Live (non-zombie) processes with an argv element equal to (or starting with) ``arg``.

        Read from ``/proc`` as psutil reads it (see :func:`split_cmdline`), without
        importing psutil: that import alone is about 13 ms of a hook (docs/performance.md).
        One process at a time, at most ``procscan.CMDLINE_BYTES`` of each command line;
        with ``uids``, only processes whose ``/proc/<pid>`` one of them owns (``procscan.scan``).
        """
        needle = os.fsencode(arg)
        found = []
        try:
            for pid, raw in scan(uids=uids):
                if needle not in raw:  # a cheap superset of the matches: an element always is a substring
                    continue
                cmd = _split_raw(raw)
                hit = any(a.startswith(arg) for a in cmd) if prefix else arg in cmd
                info = self._info(pid, identity=True) if hit else None
                if info is not None:  # None: a zombie, or it exited meanwhile
                    found.append(info)
        except OSError as exc:
            raise CommandError(("listdir", "/proc"), exc.strerror or str(exc)) from exc
        return found

    def is_alive(self, proc: ProcInfo) -> bool:
        """True while the same process (pid and start time) runs and is not a zombie.

        A start time of 0 (not known) matches no process: a pid alone may be anybody's by now.
        """
        info = self._info(proc.pid)
        return info is not None and info.create_time == proc.create_time

    def send_signal(self, proc: ProcInfo, signum: int) -> None:
        """Signal the process if it is still the same one; a vanished process is fine."""
        if self.is_alive(proc):
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass

    def job_is_running(self, job_id: int) -> bool:
        """Whether job ``job_id`` still has anything on this node: a slurmstepd of the job, or its cgroup.

        Only what Slurm makes counts, never what a user can make (issue 33: any
        user's process named ``slurmstepd`` with ``[<id>.`` in its arguments kept
        a gone job alive).  A slurmstepd is a process of root's (real or saved
        uid 0: slurmstepd takes the job user's effective uid for moments, and
        for a pty its real uid too, keeping the saved one) whose executable
        (``/proc/<pid>/exe``; ``(deleted)`` after a package upgrade) is named
        ``slurmstepd`` or ``slurmstepd-<suffix>`` (Debian's ``slurmstepd-wlm``,
        behind the ``/usr/sbin/slurmstepd`` symlink: seen in the labs of 22.05,
        24.11 and 26.05), wherever it lies (``/usr/sbin``, ``/opt/slurm/sbin``,
        a chroot), and whose title (Slurm's ``setproctitle``) holds
        ``[<id>.<step>``.  A job's cgroup is a directory ``job_<id>`` of root's
        in Slurm's cgroup v2 or v1 layout: Slurm creates it as root (only the
        step directories below it are the user's), and a directory a user
        creates (in a cgroup delegated to them) is theirs.

        Every process costs one bounded read of its command line
        (``procscan.scan``); the owner and the executable are read only for
        those whose title names the job.
        """
        import glob

        tag = f"[{job_id}.".encode()
        try:
            if any(tag in raw and _is_slurmstepd(pid) for pid, raw in scan()):
                return True
        except OSError as exc:
            raise CommandError(("listdir", "/proc"), exc.strerror or str(exc)) from exc
        # cgroup v2 (slurmstepd.scope) and v1 (<controller>/slurm*/uid_*/job_N) layouts
        patterns = (
            f"{_CGROUP}/system.slice/slurmstepd.scope/job_{job_id}",
            f"{_CGROUP}/*/slurm*/uid_*/job_{job_id}",
        )
        return any(_roots_dir(path) for pattern in patterns for path in glob.glob(pattern))

    def driver_clients(self, uid: int) -> list[ProcInfo]:
        """Live processes of ``uid`` that hold a file of the NVIDIA driver open (``/dev/nvidia*``).

        ``uid`` is judged as :func:`procscan.scan` judges it (the owner of
        ``/proc/<pid>``: one ``stat``, nothing read of another user's process);
        of each of its processes at most :data:`_MAX_FDS` descriptors are looked
        at (``/proc/<pid>/fd`` in descriptor order: the driver's are opened early).
        """
        try:
            pids = [pid for pid, _ in scan(uids=(uid,), max_bytes=0)]
        except OSError as exc:
            raise CommandError(("listdir", "/proc"), exc.strerror or str(exc)) from exc
        found = []
        for pid in pids:
            info = self._info(pid, identity=True) if _holds_driver(pid) else None
            if info is not None:  # None: gone meanwhile, or a zombie (its descriptors are closed)
                found.append(info)
        return found

    def port_in_use(self, address: str, port: int) -> bool:
        """Whether a TCP listener could not bind ``address:port`` now."""
        import errno

        return _bind_errno(address, port, reuse=True) == errno.EADDRINUSE

    def tcp_reach(self, addresses: Sequence[str], port: int, timeout_s: float) -> dict[str, str]:
        """Try a TCP connection to ``port`` on every address at once (non-blocking, one ``select``).

        ``refused`` means an RST came back (the path works, nothing listens,
        or a firewall that rejects); ``timeout`` that nothing came back (a
        firewall that drops, or a tray that is gone).
        """
        import errno
        import selectors
        import socket

        out: dict[str, str] = {}
        pending: dict[socket.socket, str] = {}
        sel = selectors.DefaultSelector()
        try:
            for addr in addresses:
                s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                rc = s.connect_ex((addr, port))
                if rc in (0, errno.EINPROGRESS):
                    pending[s] = addr
                    sel.register(s, selectors.EVENT_WRITE)
                else:
                    out[addr] = _reach_word(rc)
                    s.close()
            deadline = time.monotonic() + timeout_s
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    out[pending.pop(sock)] = _reach_word(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
                    sel.unregister(sock)
                    sock.close()
        finally:
            for sock, addr in pending.items():
                out.setdefault(addr, "timeout")
                sock.close()
            sel.close()
        return out

    def tcp_links(self, address: str, port: int) -> tuple[frozenset[str], frozenset[str]] | None:
        """This network namespace's ESTABLISHED TCP connections on ``port`` at ``address``, both ways.

        Returns ``(incoming, outgoing)``: the remote addresses connected to
        ``address:port``, and those whose ``port`` ``address`` is connected
        to.  Read from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (IPv4-mapped
        entries), the kernel's table of this process's network namespace: a
        prolog runs in its tray's.  None when neither can be read.
        """
        incoming: set[str] = set()
        outgoing: set[str] = set()
        read = False
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table, encoding="ascii", errors="replace") as f:
                    lines = f.read().splitlines()[1:]
            except OSError:
                continue
            read = True
            for local, remote in _established(lines):
                if local[0] == address and local[1] == port:
                    incoming.add(remote[0])
                elif local[0] == address and remote[1] == port:
                    outgoing.add(remote[0])
        return (frozenset(incoming), frozenset(outgoing)) if read else None

    def tcp_sockets(self, ports: Collection[int], address: str | None = None) -> list[TcpSocket] | None:
        """This network namespace's TCP sockets on ``ports``, each with its holder (:func:`read_tcp_sockets`)."""
        return read_tcp_sockets(ports, address)

    def is_local_address(self, address: str) -> bool:
        """Whether binding ``address`` (any port) works: the kernel refuses an address of no interface.

        Only a bind, no psutil (about 13 ms to import on the prolog's path).
        With ``net.ipv4.ip_nonlocal_bind = 1`` every address binds, and this says yes.
        """
        import errno

        return _bind_errno(address, 0, reuse=False) != errno.EADDRNOTAVAIL

    def monotonic(self) -> float:
        """Monotonic clock, seconds."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep."""
        time.sleep(max(0.0, seconds))

    def time(self) -> float:
        """Wall clock, seconds since the epoch."""
        return time.time()

    def since_boot(self) -> float:
        """``CLOCK_BOOTTIME``: the clock of the kernel's process start times."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def euid(self) -> int:
        """Effective user id."""
        return os.geteuid()

    @staticmethod
    def _info(pid: int, *, identity: bool = False) -> ProcInfo | None:
        """The live process ``pid`` from ``/proc``; None when it is gone or a zombie.

        Read directly, as psutil reads the same files: importing psutil costs
        about 13 ms, and every epilog that stops a daemon calls this through
        :meth:`send_signal` (docs/performance.md).  With ``identity``, also its
        uid and executable (:mod:`imexctl.imex.procs` decides from them whether
        it is a daemon).
        """
        try:
            state, start = _stat(pid)
            if state in (b"Z", b"X"):  # zombie or dead: proc(5), field 3
                return None
            info = ProcInfo(pid, start, _cmdline(pid), os.getpgid(pid), os.getsid(pid))
            return info._replace(uid=_uid(pid), exe=_exe(pid)) if identity else info
        except (OSError, ValueError, IndexError):  # ProcessLookupError, /proc/<pid> gone, or unreadable
            return None


#: the most open descriptors of one process that :meth:`RealHost.driver_clients` looks at
_MAX_FDS = 4096


def _holds_driver(pid: int) -> bool:
    """Whether one of the first :data:`_MAX_FDS` descriptors of ``pid`` is a file of the NVIDIA driver."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_FDS:
                    return False
                try:
                    if os.readlink(entry.path).startswith("/dev/nvidia"):
                        return True
                except OSError:  # closed meanwhile
                    continue
    except OSError:  # gone, or not ours to read
        return False
    return False


def _bind_errno(address: str, port: int, *, reuse: bool) -> int:
    """Bind a TCP socket to ``address:port`` and close it: 0, EADDRINUSE or EADDRNOTAVAIL.

    Through ``_socket``, the C module that ``socket`` wraps, as :meth:`RealHost.resolve`:
    ``socket`` turns its constants into enums when imported (about 3 ms of every
    prolog), and a bind needs neither its socket class nor its enums.

    Raises:
        CommandError: any other error of the bind (named with the address).
    """
    import _socket
    import errno

    s = _socket.socket(_socket.AF_INET6 if ":" in address else _socket.AF_INET, _socket.SOCK_STREAM)
    try:
        if reuse:
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        s.bind((address, port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            return exc.errno
        raise CommandError(("bind", f"{address}:{port}"), exc.strerror or str(exc)) from exc
    finally:
        s.close()
    return 0


def _stat(pid: int) -> tuple[bytes, float]:
    """Process ``pid``'s state letter (field 3 of ``/proc/<pid>/stat``) and start in seconds since boot.

    The start is ``starttime``, field 22; proc(5): "The time the process
    started after system boot", in clock ticks.  It never changes.  psutil's
    ``create_time()`` adds the boot time of ``/proc/stat``, which the kernel
    recomputes from the wall clock on every read, so it moves when the clock
    is stepped (and can flip by a second under NTP): the same process would
    look like another one (giampaolo/psutil issues #2526 and #2541).
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # the command name (field 2) is in parentheses and may hold blanks or ')': split after the last ')'
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0], int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _zombie_start(pid: int) -> float:
    """The start of our child ``pid`` that exited already (a zombie until it is reaped); 0.0 when gone.

    Its ``/proc/<pid>/stat`` stays readable until the parent reaps it, so the
    start read there is that very process's, never a later one's with the
    same pid.
    """
    try:
        return _stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return 0.0


def _uid(pid: int) -> int:
    """Process ``pid``'s real user id: the first number of the ``Uid:`` line of ``/proc/<pid>/status``."""
    return _uids(pid)[0]


def _uids(pid: int, proc: str = "/proc") -> tuple[int, int, int, int]:
    """Process ``pid``'s real, effective, saved and file-system uids: the ``Uid:`` line of ``/proc/<pid>/status``."""
    with open(f"{proc}/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                real, effective, saved, fs = (int(x) for x in line.split()[1:5])
                return real, effective, saved, fs
    raise ValueError(f"/proc/{pid}/status has no Uid line")


def _exe(pid: int, proc: str = "/proc") -> str:
    """Process ``pid``'s executable, or '' where the kernel does not show it (another user's, to non-root)."""
    try:
        return os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        return ""


def _cmdline(pid: int) -> tuple[str, ...]:
    """Process ``pid``'s argv from ``/proc/<pid>/cmdline``, split as psutil splits it.

    Elements end with NUL bytes.  A process that rewrote its title
    (setproctitle) may leave blanks between the words instead and no final
    NUL, or one final NUL after them all: then the words are split at blanks.
    Empty for a kernel thread.
    """
    return _split_raw(read_cmdline(pid))


def _split_raw(raw: bytes) -> tuple[str, ...]:
    """The argv in the first bytes of a command line; a cut-off last element is left out.

    ``procscan`` reads at most ``CMDLINE_BYTES``: when that much came back,
    the command line may go on, and what follows the last NUL is part of an
    element (split as a whole, the text would be taken for a title with blanks).
    """
    if len(raw) >= CMDLINE_BYTES and b"\0" in raw:
        raw = raw[: raw.rindex(b"\0") + 1]
    return split_cmdline(os.fsdecode(raw))


#: where the cgroup file systems are mounted
_CGROUP = "/sys/fs/cgroup"
#: what names Slurm's step daemon: the base name of its executable, or its start before a packager's suffix
#: (Debian and Ubuntu install /usr/sbin/slurmstepd-wlm, /usr/sbin/slurmstepd a symlink to it through alternatives)
_SLURMSTEPD = "slurmstepd"
#: what the kernel appends to /proc/<pid>/exe when the file was replaced (a package upgrade under a running job)
_DELETED = " (deleted)"


def _is_slurmstepd(pid: int) -> bool:
    """Whether process ``pid`` is root's slurmstepd (see :meth:`RealHost.job_is_running`).

    Judged by its executable where the kernel shows it; to a caller that is
    not root, which may not read root's ``/proc/<pid>/exe``, by its command
    name (``/proc/<pid>/comm``: a user may name their own processes so, but
    cannot give them uid 0).
    """
    try:
        real, _, saved, _ = _uids(pid)
        if 0 not in (real, saved):
            return False
        exe = _exe(pid)
        if exe:
            name = os.path.basename(exe.removesuffix(_DELETED))
            return name == _SLURMSTEPD or name.startswith(f"{_SLURMSTEPD}-")
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read(64).rstrip(b"\n") == _SLURMSTEPD.encode()
    except (OSError, ValueError):
        return False


def _roots_dir(path: str) -> bool:
    """Whether ``path`` is a directory (not a symlink) owned by root."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def split_cmdline(data: str) -> tuple[str, ...]:
    """The argv in the text of a ``/proc/<pid>/cmdline`` (see :func:`_cmdline`)."""
    if not data:
        return ()
    sep = "\0" if data.endswith("\0") else " "
    args = data[:-1].split(sep) if data.endswith(sep) else data.split(sep)
    if sep == "\0" and len(args) == 1 and " " in args[0]:
        args = args[0].split(" ")
    return tuple(args)


def _collect(p: subprocess.Popen[bytes], timeout_s: float) -> tuple[str, str, str]:
    """Read a child's stdout and stderr until it exits: ``(stdout, stderr, problem)``.

    ``problem`` is '' on success, else why reading stopped: the deadline passed or the
    output exceeded :data:`MAX_OUTPUT` (what was read so far is returned with it).
    """
    import selectors
    import subprocess

    assert p.stdout is not None
    assert p.stderr is not None
    deadline = time.monotonic() + timeout_s
    fds = (p.stdout.fileno(), p.stderr.fileno())
    bufs = {fd: bytearray() for fd in fds}
    problem = ""
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and not problem:
            left = deadline - time.monotonic()
            ready = sel.select(left) if left > 0 else []
            if not ready:
                problem = f"no answer within {timeout_s:.3g}s"
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                bufs[key.fd] += chunk
                if sum(map(len, bufs.values())) > MAX_OUTPUT:
                    problem = f"printed more than {MAX_OUTPUT} bytes"
    if not problem:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            problem = f"no answer within {timeout_s:.3g}s"
    out, err = (bytes(bufs[fd]).decode(errors="replace") for fd in fds)
    return out, err, problem


#: ``st`` of an ESTABLISHED socket in /proc/net/tcp (include/net/tcp_states.h)
_TCP_ESTABLISHED = "01"


def _established(lines: Sequence[str]) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """``(local, remote)`` IPv4 endpoints of the ESTABLISHED connections in /proc/net/tcp{,6} lines."""
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[3] != _TCP_ESTABLISHED:
            continue
        local, remote = _endpoint(fields[1]), _endpoint(fields[2])
        if local is not None and remote is not None:
            yield local, remote


def _endpoint(text: str) -> tuple[str, int] | None:
    """``0100007F:1F90`` (or its IPv4-mapped IPv6 form) -> ``("127.0.0.1", 8080)``; None for anything else.

    The kernel prints each 32-bit word of the address in host byte order.
    """
    hexaddr, _, hexport = text.partition(":")
    try:
        port = int(hexport, 16)
        raw = bytes.fromhex(hexaddr)
    except ValueError:
        return None
    words = [raw[i : i + 4][::-1] if sys.byteorder == "little" else raw[i : i + 4] for i in range(0, len(raw), 4)]
    data = b"".join(words)
    if len(data) == 16 and data[:12] == b"\0" * 10 + b"\xff\xff":
        data = data[12:]
    if len(data) != 4:
        return None
    return ".".join(str(b) for b in data), port


def _reach_word(err: int) -> str:
    """``open`` for 0, else the connection error in a word or two (``refused``, ``no route to host``, ...)."""
    import errno
    import os

    if err == 0:
        return "open"
    if err == errno.ECONNREFUSED:
        return "refused"
    if err == errno.ETIMEDOUT:
        return "timeout"
    return os.strerror(err).lower()


# ---------------------------------------------------------------- who holds a port

#: the TCP states by the ``st`` column of /proc/net/tcp (include/net/tcp_states.h)
_TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
    "0C": "NEW_SYN_RECV",
}
#: the addresses a socket bound to any address shows
_WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 (addresses shown, nothing bound)
#: the most bytes of the passwd file read for the holders' user names
_PASSWD_BYTES = 4 << 20


def read_tcp_sockets(
    ports: Collection[int],
    address: str | None = None,
    *,
    proc: str = "/proc",
    passwd: str = "/etc/passwd",  # noqa: S107 (a file name)
) -> list[TcpSocket] | None:
    """The TCP sockets of this network namespace on ``ports``, each with the process that holds it.

    The sockets come from the kernel's own tables, ``<proc>/net/tcp`` and
    ``tcp6`` (:func:`select_sockets` says which count); each socket's holder
    is the process with a descriptor on its inode (``procscan.socket_holders``:
    the socket owner's processes first, a bounded search), read as far as
    the kernel shows it: its real uid, its command line (the first
    ``procscan.CMDLINE_BYTES``) and its executable.  The user name is looked
    up in ``passwd`` only (a bounded read of a local file: a directory
    service is never asked).  A socket bound without ``listen()`` is in
    neither table and is not found.  ``proc`` and ``passwd`` name a test's
    own tree, or doctor's ``[paths] root``.

    Returns:
        The sockets, listeners first (:func:`select_sockets`); None when neither table can be read.
    """
    table = _tcp_table(proc)
    if table is None:
        return None
    found = select_sockets(table, ports, address)
    pids = socket_holders({s.inode for s in found}, owners={s.uid for s in found}, proc=proc)
    holders = {inode: _holder(pid, proc) for inode, pid in pids.items()}
    names = _user_names(passwd)
    out = []
    for sock in found:
        holder = holders.get(sock.inode)
        uid = holder.uid if holder is not None and holder.uid >= 0 else sock.uid
        out.append(sock._replace(holder=holder, user=names.get(uid, "")))
    return out


def select_sockets(table: Sequence[TcpSocket], ports: Collection[int], address: str | None) -> list[TcpSocket]:
    """The sockets of ``table`` that can hold ``address`` (None: any) on one of ``ports``, listeners first.

    One holds it when it is bound to that address or to a wildcard
    (``0.0.0.0``, ``::``: a dual-stack socket takes the IPv4 port too), in
    any state but ``TIME_WAIT``, which binds nothing a listener's
    ``SO_REUSEADDR`` cannot take over.  Listeners come first, then sockets
    on the address itself before those on a wildcard; the table's order
    otherwise.
    """
    found = [
        s
        for s in table
        if s.port in ports and s.state != "TIME_WAIT" and (address is None or s.address in (address, *_WILDCARDS))
    ]
    return sorted(found, key=lambda s: (s.state != "LISTEN", s.address in _WILDCARDS))


def _tcp_table(proc: str) -> list[TcpSocket] | None:
    """Every socket of ``<proc>/net/tcp`` and ``tcp6``, in their order; None when neither can be read."""
    table: list[TcpSocket] = []
    read = False
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}", encoding="ascii", errors="replace") as f:
                next(f, None)  # the header
                for line in f:
                    sock = _socket_line(line)
                    if sock is not None:
                        table.append(sock)
        except OSError:
            continue
        read = True
    return table if read else None


def _socket_line(line: str) -> TcpSocket | None:
    """One line of /proc/net/tcp{,6} (``sl local rem st ... uid timeout inode ...``); None when it is not one."""
    fields = line.split()
    if len(fields) < 10:
        return None
    local = _local_address(fields[1])
    state = _TCP_STATES.get(fields[3].upper())
    try:
        uid, inode = int(fields[7]), int(fields[9])
    except ValueError:
        return None
    if local is None or state is None:
        return None
    return TcpSocket(local[0], local[1], state, uid, inode)


def _local_address(text: str) -> tuple[str, int] | None:
    """``0100007F:1F90`` -> ``("127.0.0.1", 8080)``; an IPv6 address as ``inet_ntop`` writes it; None for garbage.

    The kernel prints each 32-bit word of the address in host byte order;
    an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) comes back as IPv4.
    """
    import _socket  # see _bind_errno

    hexaddr, _, hexport = text.partition(":")
    try:
        port = int(hexport, 16)
        raw = bytes.fromhex(hexaddr)
    except ValueError:
        return None
    if len(raw) not in (4, 16) or not 0 <= port <= 65535:
        return None
    words = [raw[i : i + 4][::-1] if sys.byteorder == "little" else raw[i : i + 4] for i in range(0, len(raw), 4)]
    data = b"".join(words)
    if len(data) == 16 and data[:12] == b"\0" * 10 + b"\xff\xff":
        data = data[12:]
    if len(data) == 4:
        return ".".join(str(b) for b in data), port
    return _socket.inet_ntop(_socket.AF_INET6, data), port


def _holder(pid: int, proc: str) -> ProcInfo | None:
    """Process ``pid`` as far as ``<proc>/<pid>`` shows it: real uid, command line, executable; None when gone."""
    try:
        uid = _uids(pid, proc)[0]
        fd = os.open(f"{proc}/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, CMDLINE_BYTES)
        finally:
            os.close(fd)
    except (OSError, ValueError):  # gone meanwhile, or unreadable
        return None
    return ProcInfo(pid, 0.0, _split_raw(raw), uid=uid, exe=_exe(pid, proc))


def _user_names(passwd: str) -> dict[int, str]:
    """User names by uid from a passwd file (its first :data:`_PASSWD_BYTES`); empty when it cannot be read."""
    try:
        fd = os.open(passwd, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            data = os.read(fd, _PASSWD_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return {}
    names: dict[int, str] = {}
    for line in data.decode(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            names.setdefault(int(fields[2]), fields[0])
    return names
