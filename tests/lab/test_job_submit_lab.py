"""hooks/slurmctld/job_submit.lua under the real slurmctld (JobSubmitPlugins=lua), each Slurm version (issue 21).

The module restarts the lab with ``JobSubmitPlugins=lua`` and the shipped job_submit.lua beside slurm.conf,
its settings pointed at the lab's sharing partition ``shared``. A multi-node job there is made exclusive at
submission and gets its domain; a one-tray job is left alone (and so runs without IMEX, told why); with
``IMEX_MODE = "reject"`` sbatch refuses the multi-node job with the script's message.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.lab.cluster import REPO, SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import UID, events, leftovers, sbatch, wait_done

pytestmark = pytest.mark.slurm

SCRIPT = REPO / "hooks" / "slurmctld" / "job_submit.lua"


def _script(mode: str) -> str:
    """The shipped script with its settings for the lab: partition ``shared``, no default, ``mode``."""
    text = SCRIPT.read_text()
    settings = {
        "local IMEX_PARTITIONS = { gb200 = true }": "local IMEX_PARTITIONS = { shared = true }",
        'local DEFAULT_PARTITION = "gb200"': "local DEFAULT_PARTITION = nil",
        'local IMEX_MODE = "exclusive"': f'local IMEX_MODE = "{mode}"',
    }
    for old, new in settings.items():
        assert old in text, f"{SCRIPT} no longer has the line {old!r}"
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def with_lua(lab: SlurmLab) -> Iterator[SlurmLab]:
    """The lab with JobSubmitPlugins=lua for this module, then as before."""
    before = lab.extra_conf, dict(lab.extra_etc)
    lab.restart(before[0] + "JobSubmitPlugins=lua\n", {**before[1], "job_submit.lua": _script("exclusive")})
    try:
        yield lab
    finally:
        lab.restart(*before)


def test_multi_node_job_is_made_exclusive_and_gets_its_domain(with_lua: SlurmLab) -> None:
    """sbatch -N2 -p shared, no flag: the script makes it exclusive; both trays set up the domain."""
    lab = with_lua
    job = sbatch(lab, 'echo "channels=${NVIDIA_IMEX_CHANNELS:-none}"', NODES[:2], extra=["-p", "shared"])
    wait_done(lab, job)
    for node in NODES[:2]:
        done = events(lab, node, job, "prolog.done")[-1]
        assert done["ok"] and done.get("trays") == 2 and not done.get("skipped"), f"{node}: {done}"
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"
    assert "channels=none" not in (lab.dir / "out" / f"{job}.out").read_text()


def test_one_tray_job_is_left_alone(with_lua: SlurmLab) -> None:
    """sbatch -N1 -p shared: untouched by the script; the job may share its tray and runs without IMEX."""
    lab = with_lua
    job = sbatch(lab, "true", NODES[:1], extra=["-p", "shared"])
    wait_done(lab, job)
    done = events(lab, NODES[0], job, "prolog.done")[-1]
    assert done["ok"] and "may share its trays" in done.get("skipped", ""), done


def test_reject_mode_refuses_the_job_at_submission(with_lua: SlurmLab) -> None:
    """IMEX_MODE = "reject": sbatch fails with the script's message; no job, no prolog."""
    lab = with_lua
    (lab.dir / "etc" / "job_submit.lua").write_text(_script("reject"))  # slurmctld re-reads it per submission
    try:
        argv = ["sbatch", "-N", "2", "-w", ",".join(NODES[:2]), "-p", "shared", "-t", "5", "--wrap", "true"]
        res = lab.run(argv, user=UID, check=False, timeout=30)
        assert res.returncode != 0, f"sbatch accepted the job:\n{res.stdout}{res.stderr}"
        assert "needs whole trays for IMEX: submit it with --exclusive" in res.stderr, res.stderr
    finally:
        (lab.dir / "etc" / "job_submit.lua").write_text(_script("exclusive"))
