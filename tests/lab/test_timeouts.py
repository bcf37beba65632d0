"""slurm.conf's PrologEpilogTimeout shorter than ``[readiness] deadline_s``, a tray never ready (issue 9).

The module runs its lab with ``PrologEpilogTimeout=8`` (restarted, and put back afterwards). By default
the prolog caps its deadline below that timeout (``prolog.deadline``) and fails in time with its reason;
with ``[slurm] cap_deadline = no`` slurmd kills it (SIGTERM) and the prolog still logs why, naming the
timeout. The epilogs then leave nothing. ``PrologTimeout`` (Slurm 25.05+; it overrides
``PrologEpilogTimeout``, src/common/read_config.c) runs under the 26.05 lab; 22.05 and 24.11 only know
``PrologEpilogTimeout``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.jobs import PROLOG_TIMEOUT, events, hold_script, imexctl_settings, leftovers, sbatch
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

HOOK_TIMEOUT = 8
CONFIGURED_S = 60
BAD, GOOD = "node2", "node1"
JOB_NODES = [GOOD, BAD]


@pytest.fixture(scope="module", autouse=True)
def short_hook_timeout(lab: SlurmLab) -> Iterator[None]:
    """The lab with PrologEpilogTimeout=8 for this module, then as before."""
    lab.restart(lab.extra_conf, lab.extra_etc, prolog_epilog_timeout=HOOK_TIMEOUT)
    yield
    lab.restart(lab.extra_conf, lab.extra_etc, prolog_epilog_timeout=PROLOG_TIMEOUT)


def _failed_prologs(lab: SlurmLab, job: int) -> dict[str, dict[str, Any]]:
    """Run until every prolog of the job has ended and the epilogs are done; return the prolog summaries."""

    def ended() -> dict[str, dict[str, Any]] | None:
        done = {n: events(lab, n, job, "prolog.done") for n in JOB_NODES}
        return {n: d[-1] for n, d in done.items()} if all(done.values()) else None

    done = wait_for(ended, HOOK_TIMEOUT + 30, 0.2, what=f"the prologs of job {job}")
    wait_for(lambda: all(events(lab, n, job, "epilog.done") for n in JOB_NODES), 40, 0.2, what="the epilogs")
    return done


def test_deadline_capped_below_prolog_epilog_timeout(lab: SlurmLab) -> None:
    """deadline_s 60 under PrologEpilogTimeout=8: capped to 4 s (logged); the prolog fails in time and rolls back."""
    lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(CONFIGURED_S)}}):
        job = sbatch(lab, hold_script(lab), JOB_NODES)
        done = _failed_prologs(lab, job)
    for node in JOB_NODES:
        capped = events(lab, node, job, "prolog.deadline")
        assert capped and capped[-1]["hook_timeout"] == f"PrologEpilogTimeout={HOOK_TIMEOUT}s", f"{node}: {capped}"
        assert (capped[-1]["deadline_s"], capped[-1]["configured_s"]) == (HOOK_TIMEOUT / 2, CONFIGURED_S), capped
        assert done[node]["duration_s"] < HOOK_TIMEOUT, f"{node}: the prolog outlived the hook timeout: {done[node]}"
    bad = done[BAD]
    assert bad["ok"] is False and bad["error_code"] == "not_ready" and bad["exit_code"] == 75, bad
    assert "IMEX not ready after" in bad["reason"], bad
    assert events(lab, BAD, job, "prolog.rolled_back"), f"{BAD}: no roll-back"
    assert "terminated" not in bad["reason"], f"slurmd killed the prolog despite the cap: {bad}"
    for node in JOB_NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert lab.node_states()[BAD]["state"].startswith("drain"), "the never-ready tray was not drained"


def test_prolog_killed_at_prolog_epilog_timeout_logs_why(lab: SlurmLab) -> None:
    """[slurm] cap_deadline = no: slurmd SIGTERMs the prolog at 8 s; prolog.done names the timeout; nothing left."""
    lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
    with imexctl_settings(lab, {"readiness": {"deadline_s": str(CONFIGURED_S)}, "slurm": {"cap_deadline": "no"}}):
        job = sbatch(lab, hold_script(lab), JOB_NODES)
        done = _failed_prologs(lab, job)
    for node in JOB_NODES:
        last = done[node]
        assert last["ok"] is False and last["error_code"] == "terminated", f"{node}: {last}"
        assert "terminated by SIGTERM after" in last["reason"], f"{node}: {last}"
        want = f"(slurm.conf PrologEpilogTimeout={HOOK_TIMEOUT}s; readiness deadline {CONFIGURED_S}s)"
        assert want in last["reason"], f"{node}: {last}"
        assert not events(lab, node, job, "prolog.deadline"), f"{node}: the cap is off, yet it logged a deadline"
        # the epilog is safe after the killed prolog: whatever the roll-back had no time for, it removes
        assert events(lab, node, job, "epilog.done")[-1]["ok"] is True, f"{node}: {events(lab, node, job)}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_prolog_timeout_of_slurm_25_05_caps_the_deadline(lab: SlurmLab) -> None:
    """26.05: PrologTimeout=8 under a long PrologEpilogTimeout: slurmd and the cap both take PrologTimeout."""
    if lab.version_info < (25, 5):
        pytest.skip(f"PrologTimeout came in Slurm 25.05, the lab runs {lab.version}")
    module = lab.extra_conf, dict(lab.extra_etc)
    lab.restart(module[0] + f"PrologTimeout={HOOK_TIMEOUT}\n", module[1], prolog_epilog_timeout=PROLOG_TIMEOUT)
    try:
        lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
        with imexctl_settings(lab, {"readiness": {"deadline_s": str(CONFIGURED_S)}}):
            job = sbatch(lab, hold_script(lab), JOB_NODES)
            done = _failed_prologs(lab, job)
        for node in JOB_NODES:
            capped = events(lab, node, job, "prolog.deadline")
            assert capped and capped[-1]["hook_timeout"] == f"PrologTimeout={HOOK_TIMEOUT}s", f"{node}: {capped}"
            assert done[node]["duration_s"] < HOOK_TIMEOUT, f"{node}: outlived PrologTimeout: {done[node]}"
        assert done[BAD]["error_code"] == "not_ready" and "terminated" not in done[BAD]["reason"], done[BAD]
        for node in JOB_NODES:
            assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    finally:
        lab.faults.write_text("")
        if "job" in locals():
            lab.run(["scancel", str(job)], check=False)
            wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, 0.5, what="the queue")
        for node, st in lab.node_states().items():  # the never-ready tray was drained: restart waits for idle
            if st["state"] != "idle":
                lab.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        lab.restart(*module, prolog_epilog_timeout=HOOK_TIMEOUT)
