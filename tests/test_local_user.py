"""What a local user's processes and files can do to the real hooks (issue 33 §1), with the attacker as ``imexlab``.

Every test runs real prolog and epilog processes (the simulator's rack, or the
hooks' fast path from a config under ``tmp_path``) beside processes or files
that the unprivileged user made.  Costs are asserted as what the hook read
(``rchar``), never as time: the timings are bench/run's (``attack`` section).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.commands.demo import SimRack
from imexctl.config.settings import Settings
from imexctl.platform import procscan
from tests.support.fakes import job_env
from tests.support.localuser import fat_processes, needs_local_user, read_counted, shared_dir, spawn_as_user
from tests.support.racks import sim_racks

pytestmark = needs_local_user

REPO = Path(__file__).resolve().parent.parent
#: the console script's start: an isolated interpreter, the checkout first on the path, then main()
MAIN = f"import sys; sys.path.insert(0, {str(REPO)!r}); from imexctl.cli import console; console()"
#: the attacker's processes: each with about 1 MB of command line (a quarter of the default stack limit at most)
FAT_BYTES = 1 << 20
FAT_COUNT = 12


@pytest.fixture
def make_rack() -> Iterator[Any]:
    """Simulated racks that clean up after themselves."""
    with sim_racks(SimRack, "imxu") as make:
        yield make


def _log(tray: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tray.root / "var/log/imexctl.log").read_text().splitlines()]


# ---------------------------------------------------------------- memory and time amplification


def test_an_idle_epilog_reads_a_bounded_part_of_a_users_command_lines(make_settings: Callable[..., Settings]) -> None:
    """Beside a local user's processes with 1 MB command lines, an idle epilog reads no more than beside none.

    Issue 33: every scan of ``/proc`` read each process's whole command line
    and kept them all at once, so an unrelated job's epilog grew with the
    user's forks (1.1 GiB and 2.2 s for 201 forks of 6 MB).  The fast path
    asks only root's processes (an IMEX daemon is root's), with bounded
    reads: a user's processes cost it nothing, dumpable or not.
    """
    cfg = make_settings(policy={"fabric": "none"})
    argv = [sys.executable, "-I", "-c", MAIN, "--config", str(cfg.source), "epilog"]
    env = job_env(job_id=78)
    before = min(read_counted(argv, env)[1] for _ in range(2))
    with (
        fat_processes(FAT_COUNT - 2, FAT_BYTES, marker="idle-epilog") as fat,
        fat_processes(2, FAT_BYTES, dumpable=False),
    ):
        runs = [read_counted(argv, env) for _ in range(2)]
        assert all(Path(f"/proc/{pid}").exists() for pid in fat)
    assert [rc for rc, _, _ in runs] == [0, 0], runs
    assert [r["event"] for r in map(json.loads, cfg.paths.log_file.read_text().splitlines())][-1] == "epilog.done"
    more = min(read for _, read, _ in runs) - before
    # the user's processes: nothing at all; other processes that came meanwhile: a bound each
    assert more < FAT_COUNT * procscan.CMDLINE_BYTES, f"read {more} bytes more beside {FAT_COUNT} fat processes"


# ---------------------------------------------------------------- a fake slurmstepd


def test_a_users_fake_slurmstepd_keeps_no_gone_job_alive(make_rack: Any) -> None:
    """A local user's symlink named slurmstepd, titled ``[4242.extern]``: the next prolog and cleanup clear job 4242.

    Issue 33: ``job_is_running`` took any process named ``slurmstepd*``
    whose arguments held ``[<id>.``: the next job's prolog refused the tray
    with ``domain_busy`` (a drain) and ``cleanup`` skipped the job.
    """
    rack = make_rack(1)
    t = rack.trays[0]

    def leave(job: int) -> None:
        """The job's daemon dies and its epilog never comes: leftovers of a job that no longer runs here."""
        assert [r.returncode for r in rack.run_hooks("prolog", job)] == [0]
        os.kill(int((t.root / f"run/imexctl/jobs/{job}/daemon.pid").read_text().split()[0]), signal.SIGKILL)

    leave(4242)
    with shared_dir() as public:
        link = public / "slurmstepd"
        link.symlink_to("/bin/sh")
        fakes = [spawn_as_user([str(link), "-c", "sleep 600; :", f"[{job}.extern]"]) for job in (4242, 4252)]
        try:
            for p, job in zip(fakes, (4242, 4252)):
                _wait_for(
                    lambda p=p, job=job: f"[{job}.extern]".encode() in Path(f"/proc/{p.pid}/cmdline").read_bytes()
                )
            (result,) = rack.run_hooks("prolog", 4243)
            assert result.returncode == 0, result.output
            removed = [r for r in _log(t) if r["event"] == "state.removed" and r.get("job_id") == 4243]
            assert removed and "leftovers of job 4242" in removed[0]["reason"], removed
            assert [r.returncode for r in rack.run_hooks("epilog", 4243)] == [0]
            leave(4252)
            done = rack.imexctl(t, "cleanup")
            assert done.returncode == 0 and "job 4252" in done.stdout and "skipped" not in done.stdout, done.stdout
        finally:
            for p in fakes:
                p.kill()
                p.wait()
    assert rack.leftovers() == []


def _wait_for(probe: Callable[[], bool], timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline
        time.sleep(0.01)
