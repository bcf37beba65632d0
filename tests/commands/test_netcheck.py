"""``imexctl netcheck``: several trays as real processes on 127.0.0.x addresses, each as srun would start it (issue 22).

Each tray is ``python -m imexctl netcheck`` with the environment of one task
of ``srun -N<n> --ntasks-per-node=1``; the trays' names resolve through a
hosts file to loopback addresses of their own (127/8 is all on ``lo``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl import slurm
from imexctl.commands import netcheck
from imexctl.config.settings import Settings
from tests.support.localuser import needs_local_user

REPO = Path(__file__).resolve().parents[2]


def _plan(trays: int = 3, me: int = 0, job_id: int = 4242) -> netcheck.Plan:
    tt = tuple(netcheck.Tray(f"gb{i + 1:02d}", f"127.0.0.{i + 1}") for i in range(trays))
    return netcheck.Plan(job_id, me, tt, (("server", 61000, 61999), ("cmd", 62000, 62999)), 5.0)


class TestPorts:
    def test_each_tray_has_its_own_candidates_in_each_range(self) -> None:
        """Tray i tries LOW + (job + size/2 + i + k*n) % size: the same list on every tray, disjoint between trays."""
        plan = _plan(3)
        assert plan.ports(0, "server") == [61742, 61745, 61748, 61751]
        assert plan.ports(1, "cmd") == [62743, 62746, 62749, 62752]
        every = [p for i in range(3) for p in plan.ports(i, "server")]
        assert len(every) == len(set(every)) == 3 * netcheck.WINDOW
        # the port of the job's own IMEX domain, and those of the hundred jobs after it (seen in the lab: the
        # next job's prolog found its port still bound by netcheck)
        assert not {61000 + (4242 + d) % 1000 for d in range(100)} & set(every)

    def test_a_small_range_wraps_without_repeats(self) -> None:
        """A range smaller than the window gives each of its ports once."""
        assert netcheck.candidates(6, 0, 18, 50000, 50001) == [50001, 50000]


class TestMatrix:
    def test_all_reached_is_clean(self) -> None:
        """Every row reports ok on both ranges: ok cells, '-' on the diagonal, nothing blocked."""
        plan = _plan(2)
        rows = {
            "gb01": {"to": {"gb02": {"server": "ok:61243", "cmd": "ok:62243"}}},
            "gb02": {"to": {"gb01": {"server": "ok:61242", "cmd": "ok:62242"}}},
        }
        text, bad = netcheck.render_matrix(plan, rows)
        lines = text.splitlines()
        assert not bad and lines[1].split() == ["gb01", "gb02"] and "blocked" not in text
        assert [line.split() for line in lines[2:]] == [["from", "gb01", "-", "ok"], ["from", "gb02", "ok", "-"]]
        assert lines[1].index("gb02") + 4 == lines[2].index(" ok") + 3  # columns line up

    def test_blocked_and_missing_rows_are_named(self) -> None:
        """A blocked range shows as its label with the reason below; a tray without a row shows '?'."""
        plan = _plan(3)
        rows = {
            "gb01": {"to": {"gb02": {"server": "ok:1", "cmd": "timed out (dropped: a firewall?) on port 62243"},
                            "gb03": {"server": "ok:1", "cmd": "ok:2"}}},
            "gb02": {"to": {"gb01": {"server": "ok:1", "cmd": "ok:2"}, "gb03": {"server": "refused on port 1",
                            "cmd": "refused on port 2"}}},
        }  # fmt: skip
        text, bad = netcheck.render_matrix(plan, rows)
        lines = text.splitlines()
        assert bad
        assert lines[2].split() == ["from", "gb01", "-", "cmd", "ok"]
        assert lines[3].split() == ["from", "gb02", "ok", "-", "both"]
        assert lines[4].split() == ["from", "gb03", "?", "?", "-"]
        assert "  gb01 -> gb02 cmd: timed out (dropped: a firewall?) on port 62243" in lines
        assert any(line.startswith("  gb03: no report") for line in lines)


#: each tray's retry window (netcheck --timeout): it must cover the trays' start-up skew (their imports, which
#: on a loaded machine can take seconds more in one tray than in another), or a tray that started late is taken
#: for one that never answers. It costs nothing when every pair meets (a tray ends once all have reached it);
#: a blocked pair or a missing tray costs about twice the window
WINDOW_S = 15.0
#: the window of the cases with a blocked pair or a missing tray (they wait out twice the window)
SHORT_WINDOW_S = 5.0


@pytest.fixture
def rack(make_settings: Callable[..., Settings], root: Path) -> Iterator[Callable[..., list[Any]]]:
    """Start n netcheck trays (processes) on 127.0.0.x; returns their results: (returncode, stdout, stderr)."""
    started: list[subprocess.Popen[str]] = []

    def run(
        n: int,
        *,
        before: Callable[[netcheck.Plan], None] | None = None,
        timeout: float = WINDOW_S,
        absent: int | tuple[int, ...] = (),
        user: dict[int, int] | None = None,
        json_out: bool = False,
    ) -> list[Any]:
        gone = {absent} if isinstance(absent, int) else set(absent)
        base = random.randrange(20, 240 - n)
        hosts = root / "etc/imexctl/hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text("".join(f"127.0.0.{base + i} tray{i + 1}\n" for i in range(n)))
        cfg = make_settings(resolve={"method": "hosts_file"}, paths={"hosts_file": "/etc/imexctl/hosts"})
        job_id = random.randrange(1, 10**6)
        if before is not None:
            trays = tuple(netcheck.Tray(f"tray{i + 1}", f"127.0.0.{base + i}") for i in range(n))
            ranges = (("server", *cfg.ports.server_port_range), ("cmd", *cfg.ports.cmd_port_range))
            before(netcheck.Plan(job_id, 0, trays, ranges, timeout))
        for i in range(n):
            if i in gone:
                continue
            env = {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_NODELIST": f"tray[1-{n}]", "SLURMD_NODENAME": f"tray{i + 1}",
                   "SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0", "PYTHONPATH": str(REPO),
                   "IMEXCTL_CONFIG": str(cfg.source)}  # fmt: skip
            argv = [sys.executable, "-m", "imexctl", "netcheck", "--timeout", str(timeout), *(["--json"] * json_out)]
            uid = (user or {}).get(i)
            started.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=uid, cwd="/"
                )
            )
        ours = started[-(n - len(gone)) :]
        outputs = [p.communicate(timeout=60) for p in ours]
        return [(p.returncode, *out) for p, out in zip(ours, outputs)]

    yield run
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_three_trays_reach_each_other(rack: Any) -> None:
    """Three trays on their own loopback addresses: every pair reached on both ranges, exit 0 everywhere."""
    results = rack(3)
    assert [r[0] for r in results] == [0, 0, 0], results
    first = results[0][1].splitlines()
    assert first[0].startswith("netcheck job ") and "3 trays" in first[0]
    assert [line.split()[2:] for line in first[2:5]] == [["-", "ok", "ok"], ["ok", "-", "ok"], ["ok", "ok", "-"]]
    assert "reached all 2 other trays on both ranges" in results[1][1]


def test_a_tray_whose_command_ports_another_program_holds_is_named(rack: Any) -> None:
    """tray3's command-range candidates are held by a silent program: every pair into tray3 on cmd is blocked.

    The other direction and the server range stay reachable; tray3 cannot listen there, says so,
    and every tray's exit code is 1 where it saw the problem.
    """
    held: list[socket.socket] = []

    def occupy(plan: netcheck.Plan) -> None:
        for port in plan.ports(2, "cmd"):
            s = socket.socket()
            s.bind((plan.trays[2].address, port))
            s.listen(8)  # accepts (the kernel does) but never greets: "another program answers"
            held.append(s)

    try:
        results = rack(3, before=occupy, timeout=SHORT_WINDOW_S)
    finally:
        for s in held:
            s.close()
    codes = [r[0] for r in results]
    assert codes == [1, 1, 1], results
    lines = results[0][1].splitlines()
    assert [line.split()[2:] for line in lines[2:5]] == [["-", "ok", "cmd"], ["ok", "-", "cmd"], ["ok", "ok", "-"]]
    assert any(line.startswith("  tray1 -> tray3 cmd: another program answers on port") for line in lines)
    assert "NO cmd port (cannot listen on" in results[2][1]


def test_a_tray_that_never_runs_is_refused_and_unknown(rack: Any) -> None:
    """tray2's netcheck never starts: the others find its ports refused, its row is '?', both exit 1."""
    results = rack(3, absent=1, timeout=SHORT_WINDOW_S)
    assert [r[0] for r in results] == [1, 1], results
    lines = results[0][1].splitlines()
    assert [line.split()[2:] for line in lines[2:5]] == [["-", "both", "ok"], ["?", "-", "?"], ["ok", "both", "-"]]
    assert any(line.startswith("  tray1 -> tray2 server: refused on port") for line in lines)
    assert "not reached by tray2 (cmd), tray2 (server)" in results[1][1]


def test_json_gives_each_trays_outcomes_and_the_first_trays_matrix(rack: Any) -> None:
    """With --json every tray prints the envelope: its ports and outcomes; the first tray the matrix; a blocked
    check is netcheck_blocked in errors, with the same exit code as the text."""
    clean = [json.loads(out) for _, out, _ in rack(2, json_out=True)]
    assert [(e["status"], e["exit_code"], e["data"]["ok"]) for e in clean] == [("ok", 0, True)] * 2
    assert clean[0]["data"]["matrix"] == {
        "tray1": {"tray1": "-", "tray2": "ok"},
        "tray2": {"tray1": "ok", "tray2": "-"},
    }
    assert clean[1]["data"]["matrix"] is None and set(clean[1]["data"]["listening"]) == {"server", "cmd"}
    assert all(v.startswith("ok:") for v in clean[1]["data"]["reached"]["tray1"].values())
    results = rack(3, absent=1, timeout=SHORT_WINDOW_S, json_out=True)
    assert [r[0] for r in results] == [1, 1], results
    first, third = (json.loads(out) for _, out, _ in results)
    assert first["errors"][0]["code"] == "netcheck_blocked" and first["exit_code"] == 1
    assert first["data"]["matrix"]["tray2"] == {"tray1": "?", "tray2": "-", "tray3": "?"}
    assert first["data"]["reached"]["tray2"]["server"].startswith("refused on port")
    assert third["data"]["not_reached_by"] == ["tray2 (cmd)", "tray2 (server)"] and third["data"]["matrix"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: starts a tray as another user")
def test_any_user_can_run_it(rack: Any, root: Path) -> None:
    """A tray run as nobody (as srun runs a user's step) listens, connects and reports like root's."""
    for path in (root, root / "etc", root / "etc/imexctl"):
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)
    results = rack(2, user={1: 65534})
    assert [r[0] for r in results] == [0, 0], results
    assert "reached all 1 other trays on both ranges" in results[1][1]


def test_outside_a_job_step_it_says_how_to_run_it(make_settings: Callable[..., Settings]) -> None:
    """Without srun's environment: exit 65 with the srun command line."""
    from imexctl.cli import main

    cfg = str(make_settings().source)
    assert main(["--config", cfg, "netcheck"], env={"SLURMD_NODENAME": "gb01"}) == 65


def test_a_task_without_slurm_conf_checks_the_ranges_the_hooks_use(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Issue 32: a job step's task has no SLURM_CONF; netcheck reads the config beside slurmd's slurm.conf, as
    the hooks do, so it checks the job port ranges the prolog will use (not the defaults)."""
    from imexctl.cli import main
    from imexctl.config import schema

    etc = tmp_path / "etc/slurm"
    etc.mkdir(parents=True)
    (etc / "slurm.conf").write_text("ClusterName=x\n")
    (tmp_path / "hosts").write_text("127.0.0.91 tray1\n")
    beside = etc / "imexctl.conf"
    beside.write_text(f"[paths]\nroot = {tmp_path}\nhosts_file = /hosts\n[resolve]\nmethod = hosts_file\n"
                      "[ports]\nserver_port_range = 63000-63009\ncmd_port_range = 63100-63109\n")  # fmt: skip
    for path in (beside, tmp_path / "hosts"):
        path.chmod(0o644)
    monkeypatch.setattr(slurm, "SLURMD_CONFS", (str(tmp_path / "run/slurm/conf/slurm.conf"), str(etc / "slurm.conf")))
    monkeypatch.setattr(schema, "DEFAULT_CONFIG", str(tmp_path / "etc/imexctl/imexctl.conf"))
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "tray1", "SLURMD_NODENAME": "tray1", "SLURM_LOCALID": "0"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["netcheck", "--timeout", "1"], env=env)
    assert code == 0, out.getvalue()
    assert out.getvalue().startswith("netcheck job 7: 1 trays; server ports 63000-63009, cmd ports 63100-63109")


# ---------------------------------------------------------------- lines from whoever connects (issue 33)


class TestRows:
    def test_a_trays_row_is_accepted(self) -> None:
        """What run() sends: from, to (other trays, outcome per range), listen."""
        plan = _plan(3)
        row = {"from": "gb02", "to": {"gb01": {"server": "ok:1", "cmd": "refused on port 2"}}, "listen": {}}
        assert netcheck.parse_row(plan, json.dumps(row)) == (row, "")

    @pytest.mark.parametrize(
        ("row", "why"),
        [
            ("{", "not JSON"),
            ("[]", "not a row"),
            ('{"from": "gb02", "to": {}}', "not a row"),
            ('{"from": "gb09", "to": {}, "listen": {}}', "no tray of this step"),
            ('{"from": "gb02", "to": [], "listen": {}}', "not a map of the step's other trays"),
            ('{"from": "gb02", "to": {"gb02": {}}, "listen": {}}', "not a map of the step's other trays"),
            ('{"from": "gb02", "to": {"gb01": {"peer": "ok:1"}}, "listen": {}}', "not short texts per range"),
            ('{"from": "gb02", "to": {"gb01": {"server": 1}}, "listen": {}}', "not short texts per range"),
            ('{"from": "gb02", "to": {"gb01": {"server": "' + "x" * 600 + '"}}, "listen": {}}', "not short texts"),
            ('{"from": "gb02", "to": {}, "listen": []}', "not short texts per range"),
        ],
    )
    def test_anything_else_is_refused_with_why(self, row: str, why: str) -> None:
        """A line that is not exactly a tray's row is refused and says why (it crashed the report before)."""
        assert why in netcheck.parse_row(_plan(3), row)[1]

    def test_text_from_the_network_is_printed_escaped(self) -> None:
        """Terminal escapes and other unprintable characters in a row's outcome reach the matrix escaped."""
        plan = _plan(2)
        evil = "\x1b]0;owned\x07\x1b[2J\u202eREACHED\nfake line"
        rows = {"gb01": {"to": {"gb02": {"server": evil, "cmd": "ok:2"}}}}
        text, bad = netcheck.render_matrix(plan, rows)
        assert bad and "\x1b" not in text and "\u202e" not in text and "\x07" not in text
        assert "  gb01 -> gb02 server: \\x1b]0;owned\\x07\\x1b[2J\\u202eREACHED\\nfake line" in text.splitlines()


def _attacker(sends: list[tuple[str, str, int, str]], deadline_s: float = 20) -> subprocess.Popen[bytes]:
    """A local user's process: for each (source, host, port, line), connect from ``source`` until the listener
    answers with its banner, then send the line; as imexlab."""
    from tests.support.localuser import spawn_as_user

    code = (
        "import json, socket, sys, time\n"
        f"deadline = time.monotonic() + {deadline_s}\n"
        "todo = json.loads(sys.argv[1])\n"
        "while todo and time.monotonic() < deadline:\n"
        "    src, host, port, line = todo[0]\n"
        "    try:\n"
        "        with socket.create_connection((host, port), timeout=1, source_address=(src, 0)) as c:\n"
        "            c.settimeout(2)\n"
        "            if c.recv(4096).startswith(b'IMEXCTL-NETCHECK'):\n"
        "                c.sendall(line.encode() + b'\\n')\n"
        "                todo.pop(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    return spawn_as_user([sys.executable, "-I", "-c", code, json.dumps(sends)])


@pytest.fixture
def attackers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


@needs_local_user
def test_a_forged_report_from_another_address_is_ignored(rack: Any, attackers: list[Any]) -> None:
    """A local user on tray1 speaks for tray2, which never ran: tray2 stays unknown, and the report says so.

    Issue 33: tray1 took any ``ROW`` and ``HELLO``: tray2's row read "ok" to
    every tray and tray1 counted itself reached by tray2.
    """

    def forge(plan: netcheck.Plan) -> None:
        me, two = plan.trays[0], plan.trays[1]
        row = {"from": two.name, "to": {t.name: {"server": "ok:1", "cmd": "ok:2"} for t in plan.trays[::2]}}
        sends = [(me.address, me.address, plan.ports(0, "server")[0], "ROW " + json.dumps({**row, "listen": {}}))]
        sends += [(me.address, me.address, plan.ports(0, label)[0], f"HELLO {two.name}") for label in ("server", "cmd")]
        attackers.append(_attacker(sends))

    results = rack(3, before=forge, absent=1, timeout=SHORT_WINDOW_S)
    assert [r[0] for r in results] == [1, 1], results
    lines = results[0][1].splitlines()
    assert [line.split()[2:] for line in lines[2:5]] == [["-", "both", "ok"], ["?", "-", "?"], ["ok", "both", "-"]]
    assert "not reached by tray2 (cmd), tray2 (server)" in results[0][1]
    assert "ignored 3 line(s) (from 127.0.0." in lines[-1] and "tray2 speaks from 127.0.0." in lines[-1]


@needs_local_user
def test_a_malformed_or_escaping_report_neither_crashes_nor_reaches_the_terminal(
    rack: Any, attackers: list[Any]
) -> None:
    """Local users on tray2 and tray3 (which never ran netcheck), each from its tray's address: a row with
    terminal escapes is printed escaped, a malformed one is refused; tray1's report completes.

    Issue 33: the escapes were printed raw and the malformed row crashed the report (exit 70).
    """

    def forge(plan: netcheck.Plan) -> None:
        me, two, three = plan.trays[0], plan.trays[1], plan.trays[2]
        port = plan.ports(0, "server")[0]
        evil = {"server": "\x1b[2J\x1b]0;owned\x07all fine", "cmd": "ok:1"}
        row = {"from": two.name, "to": {me.name: evil}, "listen": {}}
        bad = {"from": three.name, "to": [], "listen": {}}
        sends = [(two.address, me.address, port, "ROW " + json.dumps(row))]
        sends += [(three.address, me.address, port, "ROW " + json.dumps(bad))]
        attackers.append(_attacker(sends))

    results = rack(4, before=forge, absent=(1, 2), timeout=SHORT_WINDOW_S)  # the forgers stand for tray2 and tray3
    assert [r[0] for r in results] == [1, 1], results
    out = results[0][1]
    assert "\x1b" not in out and "\x07" not in out
    assert "  tray2 -> tray1 server: \\x1b[2J\\x1b]0;owned\\x07all fine" in out.splitlines()
    assert "ROW: 'to' of tray3 is not a map of the step's other trays" in out


# ---------------------------------------------------------------- slow and silent clients (issue 41)


def _loop_plan(me: int = 0, *, trays: int = 2, timeout_s: float = 5.0, line_timeout_s: float) -> netcheck.Plan:
    """Trays on loopback addresses of their own (a random block), with the given deadlines."""
    base = random.randrange(20, 240 - trays)
    tt = tuple(netcheck.Tray(f"tray{i + 1}", f"127.0.0.{base + i}") for i in range(trays))
    ranges = (("server", 61000, 61999), ("cmd", 62000, 62999))
    return netcheck.Plan(random.randrange(1, 10**6), me, tt, ranges, timeout_s, line_timeout_s)


def _greeted(address: str, port: int) -> socket.socket:
    """A client connected to a listener, past its banner (retried until the listener is up)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=2)
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {address}:{port}"
            time.sleep(0.01)
            continue
        assert sock.recv(4096).startswith(netcheck.BANNER.encode())
        return sock


class _Trickler(threading.Thread):
    """A client past the banner that sends one byte every ``pause_s`` (never a newline), or nothing when
    ``silent``, for ``rounds`` pauses; it records the bytes sent before the listener closed the connection."""

    def __init__(self, sock: socket.socket, *, silent: bool = False, rounds: int = 40, pause_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.sock, self.silent, self.rounds, self.pause_s = sock, silent, rounds, pause_s
        self.sent = 0
        self.closed_by_peer = False
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for _ in range(self.rounds):
                if self.done.wait(self.pause_s) or self._peer_closed():
                    return
                if not self.silent:
                    self.sock.sendall(b"H")
                    self.sent += 1
        except OSError:  # reset by the listener
            self.closed_by_peer = True
        finally:
            self.sock.close()

    def _peer_closed(self) -> bool:
        import select

        if select.select([self.sock], [], [], 0)[0] and self.sock.recv(1) == b"":
            self.closed_by_peer = True
        return self.closed_by_peer


@pytest.fixture
def clients() -> Iterator[list[_Trickler]]:
    """The slow clients a test starts: stopped and joined after it."""
    started: list[_Trickler] = []
    yield started
    for t in started:
        t.done.set()
    for t in started:
        t.join()


@contextlib.contextmanager
def _listening(plan: netcheck.Plan) -> Iterator[Any]:
    """The plan's listener, served by its thread until the block ends."""
    listener = netcheck._Listener(plan)
    listener.open()
    server = threading.Thread(target=listener.serve, daemon=True)
    server.start()
    try:
        yield listener
    finally:
        listener.stop.set()
        server.join(timeout=30)
        assert not server.is_alive(), "the listener did not stop"


@pytest.mark.parametrize("silent", [False, True], ids=["trickling", "silent"])
def test_a_slow_or_silent_client_is_cut_off_at_its_lines_deadline(clients: list[_Trickler], silent: bool) -> None:
    """A client sending a byte every 0.1 s (no newline), or nothing: closed at the line's deadline (0.5 s in all,
    not per read), long before its 40 rounds are over, and named in the tray's report.

    Issue 41: every read had 2 s of its own and a line up to 65,536 bytes, so a byte a second held the one
    listener thread for 18 hours; a silent client was dropped without a word.
    """
    plan = _loop_plan(line_timeout_s=0.5)
    with _listening(plan) as listener:
        slow = _Trickler(_greeted(plan.own.address, listener.ports["server"]), silent=silent)
        clients.append(slow)
        slow.start()
        slow.join(timeout=30)
        assert slow.closed_by_peer and slow.sent < 40, (slow.sent, slow.closed_by_peer)
        with listener.lock:
            assert listener.ignored_count == 1, listener.ignored
            why = listener.ignored[0][1]
    # the bytes it had when it was let go (a byte sent in the moment of the close is not among them)
    assert why in (f"no whole line within 0.5 s ({n} bytes)" for n in (slow.sent, slow.sent - 1)), why
    assert silent == (why == "no whole line within 0.5 s (0 bytes)")


def test_peers_are_served_while_slow_and_silent_clients_hold_connections(clients: list[_Trickler]) -> None:
    """Two trays in threads; before the second starts, a trickling and a silent client hold both of the first
    tray's ports (their deadline, 30 s, outlasts the run): every pair is reached, the row arrives, and the
    slow clients were still connected when the check was done.

    Issue 41: the first tray served one connection at a time, so its peer read as blocked and its row never came.
    """
    first = _loop_plan(0, timeout_s=4.0, line_timeout_s=30.0)
    second = dataclasses.replace(first, me=1)
    reports: dict[int, netcheck.Report] = {}
    one = threading.Thread(target=lambda: reports.setdefault(0, netcheck.run(first)), daemon=True)
    one.start()
    for label in ("server", "cmd"):
        for silent in (False, True):
            sock = _greeted(first.own.address, first.ports(0, label)[0])
            if not silent:
                sock.sendall(b"H")  # a line begun before the peer comes
            slow = _Trickler(sock, silent=silent, rounds=600)
            clients.append(slow)
            slow.start()
    reports[1] = netcheck.run(second)
    one.join(timeout=60)
    assert not one.is_alive()
    for report in reports.values():
        assert not report.failed, report.text()
    assert reports[0].ignored_count == 0, reports[0].text()  # none of them reached its deadline: held to the end
    for slow in clients:  # and then let go, when the first tray stopped listening
        slow.join(timeout=10)
        assert slow.closed_by_peer, (slow.silent, slow.sent)
    assert reports[0].rows is not None and set(reports[0].rows) == {"tray1", "tray2"}
    assert "reached all 1 other trays on both ranges" in reports[1].text()


def test_a_port_that_trickles_its_greeting_is_given_up_at_the_deadline() -> None:
    """Another program on a peer's candidate port sends a byte every 0.1 s, never a newline: the check gives up
    at the greeting's deadline (0.5 s in all) with "another program answers", long before 40 bytes are out.

    Issue 41: each read of the greeting had 2 s of its own, for up to 65,536 bytes.
    """
    plan = _loop_plan(line_timeout_s=0.5)
    server = socket.socket()
    server.bind((plan.trays[1].address, 0))
    server.listen(1)
    sent: list[int] = []

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            try:
                for _ in range(40):
                    conn.sendall(b"I")
                    sent.append(1)
                    time.sleep(0.1)
            except OSError:  # the check went away
                pass

    program = threading.Thread(target=trickle, daemon=True)
    program.start()
    try:
        assert netcheck._try(plan, 1, "server", server.getsockname()[1], "HELLO tray1") == "another program answers"
        program.join(timeout=30)
    finally:
        server.close()
    assert len(sent) < 40, len(sent)


def test_past_the_connection_limit_the_rest_wait_in_the_kernels_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the limit at 2, two silent clients are served at once, and a third is greeted only once one of them
    ends (here: leaves)."""
    import select

    monkeypatch.setattr(netcheck, "_MAX_CONNECTIONS", 2)
    plan = _loop_plan(line_timeout_s=30.0)
    with _listening(plan) as listener:
        port = listener.ports["server"]
        first, second = _greeted(plan.own.address, port), _greeted(plan.own.address, port)
        assert select.select([first], [], [], 0)[0] == []  # still served (no end) while the second is greeted
        with first, second, socket.create_connection((plan.own.address, port), timeout=10) as third:
            assert select.select([third], [], [], 0.3)[0] == []  # accepted by the kernel, not served
            first.close()
            assert third.recv(4096).startswith(netcheck.BANNER.encode())
            with listener.lock:  # the first one's end, named before the third was taken
                assert listener.ignored_count == 1 and "not a HELLO or ROW line: ''" in listener.ignored[0][1]
