"""A job's port taken on the tray: the prolog names who holds it, and calls only an IMEX daemon stale (issue 41).

Before, any taken port failed ``domain_busy`` with "is in use (a stale IMEX
daemon?)", whoever held it: a local user's listener drained the tray blaming
a daemon that was not there.  The holder comes from the kernel's socket
table and the process's descriptors (``Host.tcp_sockets``; here the fake's
``sockets``), and is judged by its uid and executable, never its words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imexctl.hooks import portholder
from imexctl.hooks.prolog import prolog
from imexctl.platform.errors import DomainBusyError, ExitCode, PortHeldError
from imexctl.platform.host import TcpSocket
from tests.support.fakes import FakeHost, job_env

#: job 42's ports on gb01 (10.0.0.1), by the default ranges
SERVER, CMD = 61042, 62042
HTTP = ["python3", "-m", "http.server", str(SERVER)]


def _held(host: FakeHost, port: int, argv: list[str], *, uid: int, user: str = "", address: str = "10.0.0.1",
          exe: str | None = None, found: bool = True) -> TcpSocket:  # fmt: skip
    """A listener of a process with ``argv`` and ``uid`` on ``address:port``, in the fake's socket table."""
    proc = host.add_process(argv, uid=uid, exe=exe)
    sock = TcpSocket(address, port, "LISTEN", uid, 70000 + port, proc if found else None, user)
    host.ports_in_use.add(("10.0.0.1", port))
    host.sockets = [*(host.sockets or []), sock]
    return sock


def _leftovers(root: Path) -> list[str]:
    return [str(p) for d in ("run/imexctl/jobs", "dev/nvidia-caps-imex-channels") for p in (root / d).glob("*")]


def _refused(rt: Any, host: FakeHost, root: Path, kind: type[Exception]) -> str:
    """Run job 42's prolog, which must fail with ``kind`` before any daemon starts and leave nothing; its message."""
    with pytest.raises(kind) as caught:
        prolog(job_env(job_id=42), rt)
    assert _leftovers(root) == [] and not any(c[0] == "spawn" for c in host.calls)
    return str(caught.value)


class TestTheProlog:
    def test_a_local_users_listener_is_named_and_never_called_a_stale_daemon(
        self, rt: Any, host: FakeHost, root: Path
    ) -> None:
        """uid 1501's ``python3 -m http.server 61042`` on the tray's address: ``port_held`` (69), holder named."""
        sock = _held(host, SERVER, HTTP, uid=1501, user="imexlab")
        assert sock.holder is not None
        with pytest.raises(PortHeldError) as caught:
            prolog(job_env(job_id=42), rt)
        why = str(caught.value)
        assert why.startswith(
            f"SERVER_PORT 10.0.0.1:{SERVER} is held by pid {sock.holder.pid} (uid 1501 imexlab: python3 -m "
            f"http.server {SERVER}), not an IMEX daemon: a local user's"
        ), why
        assert "port guard" in why and "stale" not in why
        assert (caught.value.code, caught.value.exit_code) == ("port_held", ExitCode.UNAVAILABLE)
        assert _leftovers(root) == [] and not any(c[0] == "spawn" for c in host.calls)

    def test_a_users_wildcard_listener_on_the_command_port(self, rt: Any, host: FakeHost, root: Path) -> None:
        """``0.0.0.0:62042`` of uid 1501 holds the tray's IMEX_CMD_PORT too: named the same way."""
        sock = _held(host, CMD, ["nc", "-l", "-p", str(CMD)], uid=1501, address="0.0.0.0")
        assert sock.holder is not None
        why = _refused(rt, host, root, PortHeldError)
        assert why.startswith(f"IMEX_CMD_PORT 10.0.0.1:{CMD} is held by pid {sock.holder.pid} (uid 1501: nc -l -p")
        assert "not an IMEX daemon" in why and "stale" not in why

    def test_a_user_program_named_like_the_daemon_is_a_users(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A command line that says ``/usr/bin/nvidia-imex -c .../jobs/7/config.cfg`` decides nothing: uid 1501's
        program is a local user's, not job 7's daemon."""
        jobs = rt.settings.paths.jobs_dir
        _held(host, SERVER, ["/usr/bin/nvidia-imex", "-c", f"{jobs}/7/config.cfg"], uid=1501, exe="/home/u/fake")
        why = _refused(rt, host, root, PortHeldError)
        assert "not an IMEX daemon: a local user's" in why and "job 7" not in why and "stale" not in why

    def test_a_service_of_roots_in_the_ranges(self, rt: Any, host: FakeHost, root: Path) -> None:
        """root's own listener that is no IMEX daemon: ``port_held``, a service to move, no user blamed."""
        _held(host, SERVER, ["/usr/sbin/exporterd", "--port", str(SERVER)], uid=0, user="root")
        why = _refused(rt, host, root, PortHeldError)
        assert "(uid 0 root: /usr/sbin/exporterd --port 61042), not an IMEX daemon: a service of root's" in why
        assert "local user" not in why

    def test_a_hand_started_imex_daemon_is_called_stale(self, rt: Any, host: FakeHost, root: Path) -> None:
        """root's nvidia-imex with the stock config on the job's port: an IMEX daemon of no job, ``domain_busy``."""
        sock = _held(host, SERVER, ["/usr/bin/nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg"], uid=0)
        assert sock.holder is not None
        why = _refused(rt, host, root, DomainBusyError)
        assert f"is held by an IMEX daemon of no job of imexctl's, pid {sock.holder.pid} (uid 0: " in why
        assert "stale" in why

    def test_a_socket_whose_process_is_not_found_keeps_its_owner(self, rt: Any, host: FakeHost, root: Path) -> None:
        """No process holds the socket in /proc (it exited meanwhile): its owner from the table is named."""
        _held(host, SERVER, HTTP, uid=1501, user="imexlab", found=False)
        why = _refused(rt, host, root, PortHeldError)
        assert "is held by a socket of uid 1501 imexlab (LISTEN) whose process was not found, not an IMEX daemon" in why

    def test_a_port_no_table_shows(self, rt: Any, host: FakeHost, root: Path) -> None:
        """The port is taken and no socket on it is listed (a bind without listen): ``port_held``, never stale."""
        host.ports_in_use.add(("10.0.0.1", SERVER))
        host.sockets = []
        why = _refused(rt, host, root, PortHeldError)
        assert "no listener on it is in the kernel's socket tables" in why and "ss -tanp" in why


def test_an_imex_daemon_of_another_job_names_the_job(rt: Any, host: FakeHost) -> None:
    """root's daemon running job 7's config (the claim did not see it: a race, a moved program) is job 7's."""
    jobs = rt.settings.paths.jobs_dir
    _held(host, SERVER, ["/usr/bin/nvidia-imex", "-c", f"{jobs}/7/config.cfg"], uid=0)
    err = portholder.refusal("SERVER_PORT", "10.0.0.1", SERVER, rt)
    assert isinstance(err, DomainBusyError), err
    assert "is held by the IMEX daemon of job 7, pid" in str(err) and "imexctl cleanup --job 7 --force" in str(err)


def test_the_holder_is_asked_on_the_trays_address_and_its_port(rt: Any, host: FakeHost) -> None:
    """One question to the socket table: this port, this address (wildcards count there)."""
    host.sockets = []
    portholder.refusal("IMEX_CMD_PORT", "10.0.0.1", CMD, rt)
    assert ("tcp_sockets", "10.0.0.1", str(CMD)) in host.calls


def test_a_long_or_unprintable_command_line_is_cut_and_made_printable(rt: Any, host: FakeHost) -> None:
    """The user's command line is shown as data: one printable line of at most 60 characters."""
    _held(host, SERVER, ["evil\n\x1b[31m", "x" * 500], uid=1501)
    err = portholder.refusal("SERVER_PORT", "10.0.0.1", SERVER, rt)
    shown = str(err).split(": ", 1)[1].split("), not an IMEX daemon")[0]
    assert "\n" not in str(err) and "\x1b" not in str(err) and shown.endswith("...") and len(shown) == 60, shown
