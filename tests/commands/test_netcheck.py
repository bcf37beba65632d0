"""``imexctl netcheck``: several trays as real processes on 127.0.0.x addresses, each as srun would start it (issue 22).

Each tray is ``python -m imexctl netcheck`` with the environment of one task
of ``srun -N<n> --ntasks-per-node=1``; the trays' names resolve through a
hosts file to loopback addresses of their own (127/8 is all on ``lo``).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.commands import netcheck
from imexctl.config.settings import Settings

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


@pytest.fixture
def rack(make_settings: Callable[..., Settings], root: Path) -> Iterator[Callable[..., list[Any]]]:
    """Start n netcheck trays (processes) on 127.0.0.x; returns their results: (returncode, stdout, stderr)."""
    started: list[subprocess.Popen[str]] = []

    def run(
        n: int,
        *,
        before: Callable[[netcheck.Plan], None] | None = None,
        timeout: float = 3,
        absent: int = -1,
        user: dict[int, int] | None = None,
    ) -> list[Any]:
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
            if i == absent:
                continue
            env = {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_NODELIST": f"tray[1-{n}]", "SLURMD_NODENAME": f"tray{i + 1}",
                   "SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0", "PYTHONPATH": str(REPO),
                   "IMEXCTL_CONFIG": str(cfg.source)}  # fmt: skip
            argv = [sys.executable, "-m", "imexctl", "netcheck", "--timeout", str(timeout)]
            uid = (user or {}).get(i)
            started.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=uid, cwd="/"
                )
            )
        ours = started[-(n - (absent >= 0)) :]
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
        results = rack(3, before=occupy, timeout=2)
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
    results = rack(3, absent=1, timeout=1.5)
    assert [r[0] for r in results] == [1, 1], results
    lines = results[0][1].splitlines()
    assert [line.split()[2:] for line in lines[2:5]] == [["-", "both", "ok"], ["?", "-", "?"], ["ok", "both", "-"]]
    assert any(line.startswith("  tray1 -> tray2 server: refused on port") for line in lines)
    assert "not reached by tray2 (cmd), tray2 (server)" in results[1][1]


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
