"""Whether a job owns its trays, as each Slurm tells the prolog, under the real slurmd (issue 21).

A job that may share its trays gets no IMEX domain, its prolog exits 0 (no tray drained), and its user
reads why in the job's own output (the TaskProlog prints the prolog's note). A job that owns its trays
gets its domain. The lab's default partition ``debug`` is ``OverSubscribe=EXCLUSIVE``; the partition
``shared`` has Slurm's default ``OverSubscribe=NO``, where a plain job may share its nodes with other
jobs on other cores. Slurm 22.05 tells the prolog nothing (neither ``SLURM_JOB_OVERSUBSCRIBE`` nor
``SLURM_JOB_EXCLUSIVE``): there the prolog asks slurmctld once (``[slurm] ask_sharing``), and the same
jobs get the same outcome.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import events, imexctl_settings, leftovers, prolog_processes, sbatch, wait_done
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

TRAYS = NODES[:2]
NOTE = "imexctl: IMEX was not set up for job"

# (sbatch options, whether the job owns its trays)
CASES = {
    "no-flag": (["-p", "shared"], False),
    "exclusive": (["-p", "shared", "--exclusive"], True),
    "exclusive-user": (["-p", "shared", "--exclusive=user"], False),
    "oversubscribe": (["-p", "shared", "--oversubscribe"], False),
    "partition-exclusive": (["-p", "debug"], True),
}


def _env_script(lab: SlurmLab) -> str:
    """A batch script that prints what its task got: the channel variable (or none)."""
    return 'echo "channels=${NVIDIA_IMEX_CHANNELS:-none}"'


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_job_that_may_share_its_trays_runs_without_imex_and_is_told(lab: SlurmLab, case: str) -> None:
    """Shared: no domain, every prolog exits 0, no tray drained, one line in the job's output; else a domain."""
    opts, owns = CASES[case]
    job = sbatch(lab, _env_script(lab), TRAYS, extra=opts)
    wait_done(lab, job)
    output = (lab.dir / "out" / f"{job}.out").read_text()
    states = lab.node_states()
    for node in TRAYS:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1]["ok"] is True, f"{node}: {done}"
        assert states[node]["state"] == "idle", f"{node} after job {job} ({case}): {states[node]}"
        if owns:
            assert done[-1].get("trays") == 2 and not done[-1].get("skipped"), f"{node}: {done[-1]}"
        else:
            assert "may share its trays" in done[-1].get("skipped", ""), f"{node}: {done[-1]}"
            assert "--exclusive" in done[-1]["skipped"] and done[-1].get("told_user") is True, done[-1]
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
        asked = events(lab, node, job, "imex.sharing_unknown")
        assert not asked, f"{node}: slurmctld could not say whether job {job} shares its trays: {asked}"
        assert not list((lab.node_root(node) / "run/imexctl/notes").glob("*")), f"{node}: a note outlived job {job}"
    if owns:
        assert "channels=none" not in output and NOTE not in output, output
    else:
        assert output.count(NOTE) == 1 and "channels=none" in output, output
        line = next(ln for ln in output.splitlines() if NOTE in ln)
        assert "--exclusive" in line and "OverSubscribe=EXCLUSIVE" in line, line


def test_a_job_whose_sharing_slurmctld_does_not_tell_runs_without_imex(lab: SlurmLab) -> None:
    """Slurm 22.05, squeue failing as when slurmctld cannot be reached: three questions, then the job counts as
    one that may share (no domain, told, no drain). 24.11 and 26.05 never ask: the job gets its domain."""
    unreachable = lab.dir / "bin" / "squeue-unreachable"
    unreachable.write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    unreachable.chmod(0o755)
    with imexctl_settings(lab, {"commands": {"squeue": str(unreachable)}}):
        job = sbatch(lab, _env_script(lab), TRAYS, extra=["-p", "debug"])
        wait_done(lab, job)
    output = (lab.dir / "out" / f"{job}.out").read_text()
    asks = lab.version_info < (23, 2)
    for node in TRAYS:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1]["ok"] is True, f"{node}: {done}"
        unknown = events(lab, node, job, "imex.sharing_unknown")
        assert bool(unknown) is asks, f"{node}: {unknown}"
        if asks:
            assert unknown[-1]["tries"] == 3 and "Unable to contact slurm controller" in unknown[-1]["problem"]
            assert "slurmctld did not say" in done[-1].get("skipped", "") and done[-1].get("told_user"), done[-1]
        else:
            assert done[-1].get("trays") == 2 and not done[-1].get("skipped"), f"{node}: {done[-1]}"
        assert lab.node_states()[node]["state"] == "idle", lab.node_states()
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert (output.count(NOTE) == 1 and "channels=none" in output) is asks, output


#: Slurm 26.05's partition option Exclusive=NODE|USER|TOPO (it replaces OverSubscribe=EXCLUSIVE, ExclusiveUser
#: and ExclusiveTopo, CHANGELOG/slurm-26.05.md): what slurmd then puts in SLURM_JOB_EXCLUSIVE, read from
#: src/common/read_config.c (NODE and TOPO set max_share=0) and slurm_protocol_defs.c
#: get_job_exclusive_display_value(); SLURM_JOB_OVERSUBSCRIBE is NO (share_res=0, node_scheduler.c
#: _resolve_shared_status; USER: share_res unset in a max_share=1 partition); and whether the job owns its trays
EXCLUSIVE_26 = {"xnode": ("NODE", True), "xtopo": ("TOPO", True), "xuser": ("USER", False)}


@pytest.fixture(scope="module")
def partitions_26(lab: SlurmLab) -> Iterator[None]:
    """Three partitions with Exclusive=NODE, TOPO and USER (26.05 only: older slurmctlds refuse the key)."""
    if lab.version_info < (26, 5):
        pytest.skip(f"Exclusive= is a partition option of Slurm 26.05 (this lab runs {lab.version})")
    before = (lab.extra_conf, lab.extra_etc)
    lines = "".join(f"PartitionName={p} Nodes=ALL MaxTime=INFINITE State=UP Exclusive={v}\n"
                    for p, (v, _) in EXCLUSIVE_26.items())  # fmt: skip
    lab.restart(before[0] + lines, before[1])
    yield
    lab.restart(*before)


@pytest.mark.parametrize("partition", sorted(EXCLUSIVE_26))
def test_the_26_05_partition_option_exclusive(lab: SlurmLab, partitions_26: None, partition: str) -> None:
    """Exclusive=NODE and TOPO: slurmd says NO/NODE or NO/TOPO and the job gets its domain; Exclusive=USER:
    NO/USER, and the job may share its trays (the user's other jobs), so it runs without IMEX and is told."""
    value, owns = EXCLUSIVE_26[partition]
    lab.faults.write_text("slow_start=2\n")  # a set-up prolog runs long enough to read its environment
    job = sbatch(lab, _env_script(lab), TRAYS, extra=["-p", partition])
    seen: dict[str, dict[str, str]] = {}

    def caught() -> bool:
        seen.update({p["env"].get("SLURMD_NODENAME", "?"): p["env"] for p in prolog_processes(job)})
        return bool(seen) or bool(events(lab, TRAYS[0], job, "prolog.done"))

    wait_for(caught, 60, 0.01, what=f"job {job}'s prologs")
    wait_done(lab, job)
    output = (lab.dir / "out" / f"{job}.out").read_text()
    for node in TRAYS:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1]["ok"] is True, f"{node}: {done}"
        if owns:
            assert done[-1].get("trays") == 2 and not done[-1].get("skipped"), f"{node}: {done[-1]}"
        else:
            said = f"SLURM_JOB_EXCLUSIVE={value} SLURM_JOB_OVERSUBSCRIBE=NO"
            assert said in done[-1].get("skipped", "") and done[-1].get("told_user"), f"{node}: {done[-1]}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    if owns:
        env = next(iter(seen.values()), {})
        got = (env.get("SLURM_JOB_EXCLUSIVE"), env.get("SLURM_JOB_OVERSUBSCRIBE"))
        assert got == (value, "NO"), f"job {job} in partition {partition}: {got}"
    assert (NOTE in output) is not owns, output
