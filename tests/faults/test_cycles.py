"""At least 200 random fault cycles on the simulator (tests/faults/cycles.py), reproducible from the printed seed.

``IMEXCTL_FAULT_SEED`` pins the seed; without it every run draws a new one
and prints it.  A failure names each failed cycle and the command that
replays it; ``python -m tests.faults.soak`` runs thousands (tests/faults/README.md).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.faults import cycles, soak

CYCLES = int(os.environ.get("IMEXCTL_FAULT_CYCLES", "200"))
#: two processes, one rack each: the cycles mostly wait (daemons starting and stopping, readiness)
WORKERS = 2


def test_random_fault_cycles_leave_nothing_and_status_tells_the_truth(capsys: pytest.CaptureFixture[str]) -> None:
    """Each cycle: a random hook fault and daemon fault, then status is truthful, recovery leaves nothing,
    cleanup --dry-run names what cleanup does, and no other job's hook changes the job's domain."""
    seed = cycles.seed_from_env()
    with capsys.disabled():
        print(f"\nfault cycles: seed {seed} ({cycles.SEED_ENV}={seed} replays them)", flush=True)
    t0 = time.monotonic()
    results = soak.run_parallel(seed, list(range(CYCLES)), workers=WORKERS)
    text = soak.summary(seed, results, time.monotonic() - t0)
    with capsys.disabled():
        print(text, flush=True)
    assert len(results) == CYCLES
    failed = [soak.report(r) for r in results if r.problems]
    assert not failed, "\n".join([*failed, cycles.replay_hint(seed)])
    # the cycles reached what they are for: hooks killed by each signal, busy intruders, timeouts
    exits = {e.rsplit(": ", 1)[1] for r in results for e in r.exits}
    assert {"-9", "-15", "0", "69", "75"} <= exits, exits
