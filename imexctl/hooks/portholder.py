"""Who holds a job's port: the prolog's refusal and doctor's ``ports.listening`` name the holder alike (issue 41).

The holder is judged by what the kernel says of it, never by what its
command line says: the socket's owner in ``/proc/net/tcp`` or ``tcp6``, and
the process with a descriptor on the socket, with its real uid and its
executable (``Host.tcp_sockets``).  Of such a holder:

- an IMEX daemon (``imex/procs.py``: root's, running ``[commands]
  nvidia_imex``) is a stale daemon, of the job whose config under the jobs
  directory it runs, or of none: ``domain_busy``, as any other daemon in the
  way (``imexctl cleanup``, or stopping it by hand, frees the tray);
- any other process of root's is a service in the ``[ports]`` ranges, and
  any process of another user's is a local user's: ``port_held``, with the
  holder named (pid, uid, user name, command line) and what to do;
- a socket with no process found keeps the owner of the socket, and one the
  tables do not show (a ``bind()`` without ``listen()``) is no IMEX daemon's
  either: ``port_held``.

The command line is shown, cut and made printable, as the holder's; it
decides nothing.
"""

from __future__ import annotations

from typing import Final

from imexctl.config.settings import Settings
from imexctl.hooks.runtime import Runtime
from imexctl.platform import Record
from imexctl.platform.errors import DomainBusyError, ImexctlError, PortHeldError
from imexctl.platform.host import TcpSocket

__all__ = ["DAEMON", "GUARD", "ROOT", "UNKNOWN", "USER", "Holder", "advice", "judge", "refusal"]

#: the kinds of holder
DAEMON: Final = "daemon"
ROOT: Final = "root"
USER: Final = "user"
UNKNOWN: Final = "unknown"
#: where a site reads how to keep users off the ports for good
GUARD: Final = "the port guard, docs/security.md"
#: the most characters of a holder's command line shown
_COMMAND_CHARS: Final = 60


class Holder(Record):
    """Who holds a port: its kind, the job of an IMEX daemon, and the holder in words."""

    #: :data:`DAEMON`, :data:`ROOT` (another process of root's), :data:`USER` (another user's process), or
    #: :data:`UNKNOWN` with no process found (``uid`` is then the socket's owner)
    kind: str
    #: the holder's real uid (the socket's owner without a process)
    uid: int
    #: the job whose config an IMEX daemon runs (None: another holder, or a daemon of no job)
    job: int | None
    #: ``pid 4242 (uid 1501 imexlab: python3 -m http.server 61042)``
    text: str


def judge(sock: TcpSocket, settings: Settings, own_uid: int) -> Holder:
    """Who holds ``sock``, from its owner and its holder process (the module's docstring)."""
    from imexctl.imex import procs as imexproc

    proc = sock.holder
    if proc is None:
        name = f" {sock.user}" if sock.user else ""
        text = f"a socket of uid {sock.uid}{name} ({sock.state}) whose process was not found"
        return Holder(UNKNOWN, sock.uid, None, text)
    uid = proc.uid if proc.uid >= 0 else sock.uid
    name = f" {sock.user}" if sock.user else ""
    text = f"pid {proc.pid} (uid {uid}{name}: {_shown(proc.cmdline)})"
    if imexproc.is_daemon(proc, imexproc.programs(settings.commands.nvidia_imex), own_uid):
        return Holder(DAEMON, uid, _job_of(proc.cmdline, settings), text)
    return Holder(ROOT if uid == 0 else USER, uid, None, text)


def refusal(key: str, address: str, port: int, rt: Runtime) -> ImexctlError:
    """The prolog's error for its job's ``key`` port (``SERVER_PORT``, ``IMEX_CMD_PORT``) taken on ``address``.

    ``domain_busy`` for an IMEX daemon, which may be called stale; ``port_held``
    for anything else, which never is (the module's docstring).  A failed
    look-up still refuses the port, without a holder.
    """
    where = f"{key} {address}:{port}"
    try:
        found = rt.host.tcp_sockets((port,), address)
    except ImexctlError as exc:  # the tables could not be read: the port is taken all the same
        return PortHeldError(f"{where} is in use; who holds it could not be read ({exc})")
    if not found:
        tables = "the kernel's socket tables"
        why = f"no listener on it is in {tables}" if found is not None else f"{tables} cannot be read"
        return PortHeldError(
            f"{where} is in use, {why} (a socket bound without listen()?): find it with 'ss -tanp'; a local "
            f"user's process is kept off the ports by {GUARD}"
        )
    holder = judge(found[0], rt.settings, rt.host.euid())
    if holder.kind == DAEMON and holder.job is not None:
        return DomainBusyError(
            f"{where} is held by the IMEX daemon of job {holder.job}, {holder.text}: a stale IMEX daemon (if job "
            f"{holder.job} has ended: 'imexctl cleanup --job {holder.job} --force')"
        )
    if holder.kind == DAEMON:
        return DomainBusyError(
            f"{where} is held by an IMEX daemon of no job of imexctl's, {holder.text}: a stale or hand-started "
            "IMEX daemon; stop it"
        )
    return PortHeldError(f"{where} is held by {holder.text}, not an IMEX daemon: {advice(holder)}")


def advice(holder: Holder) -> str:
    """What to do about a holder that is no IMEX daemon (a user's process, a service of root's, or unknown)."""
    if holder.uid != 0:
        return f"a local user's; end it, and keep users off the [ports] ranges with {GUARD}"
    if holder.kind == UNKNOWN:
        return "find it with 'ss -tanp'; move whatever holds it, or move the [ports] ranges"
    return "a service of root's in the [ports] ranges; move it, or move the ranges"


def _job_of(cmdline: tuple[str, ...], settings: Settings) -> int | None:
    """The job whose directory under ``[paths] run_dir``/jobs an argument names (its ``config.cfg``), if one does."""
    prefix = f"{settings.paths.jobs_dir}/"
    heads = [arg[len(prefix) :].split("/", 1)[0] for arg in cmdline if arg.startswith(prefix)]
    ids = [int(head) for head in heads if head.isdigit()]
    return ids[0] if ids else None


def _shown(cmdline: tuple[str, ...]) -> str:
    """The command line as one printable line, cut after :data:`_COMMAND_CHARS` characters."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(cmdline)) or "(no command line)"
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."
