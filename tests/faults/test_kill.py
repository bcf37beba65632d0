"""SIGKILL at every step boundary: the next epilog or ``imexctl cleanup`` leaves the tray clean."""

from __future__ import annotations

from typing import Callable

import pytest

from tests.faults.rack import FaultRack

PROLOG_STEPS = ["start", "locked", "claimed", "files_written", "daemon_started", "ready", "channel_created"]


@pytest.mark.parametrize("step", PROLOG_STEPS)
@pytest.mark.parametrize("recover", ["epilog", "cleanup"])
def test_prolog_killed_at_each_step(make_rack: Callable[..., FaultRack], step: str, recover: str) -> None:
    """Tray 1's prolog dies at ``step``; recovery leaves nothing; the next job's prolog succeeds everywhere."""
    rack = make_rack(2, deadline_s=6)
    t1, t2 = rack.trays
    r1 = rack.start(t1, "prolog", 700, f"{step}=kill")
    r2 = rack.start(t2, "prolog", 700)
    res1, res2 = r1.result(), r2.result()
    assert res1.returncode == -9 and r1.steps()[-1] == step, res1.output
    assert res2.returncode in (0, 75), res2.output  # the peer: ready before the kill, or times out
    if recover == "epilog":
        assert [r.returncode for r in rack.run_all("epilog", 700)] == [0, 0]
    else:
        for t in rack.trays:
            done = rack.imexctl(
                t, "cleanup", "--force"
            )  # tray 2 set up its part and no epilog ran: a live job to plain cleanup
            assert done.returncode == 0, done.stdout + done.stderr
    assert rack.dirty() == []
    assert [r.returncode for r in rack.run_all("prolog", 701)] == [0, 0]
    assert [r.returncode for r in rack.run_all("epilog", 701)] == [0, 0]
    assert rack.dirty() == []
