"""A rolling upgrade while jobs run: a prolog by the old version, then the epilog by the new one (issue 23).

The old version is imexctl as it was at :data:`OLD` (the last commit that landed before this round of
work), exported from the repository's own history into the lab directory. The lab's Prolog becomes a
small switch: while ``use-old-prolog`` exists it runs the old tree (``PYTHONPATH``, the same venv), else
the repository's hooks/prolog. A job set up by the old prolog is then torn down by the new epilog, as on a
tray upgraded by clush or Ansible while the job ran (docs/operations.md "Upgrading"): the tray is clean,
and the next job, set up by the new prolog, runs.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.cluster import REPO, SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import (
    IMEXCTL_PREFIX,
    assert_domain_up,
    ctl_domain,
    events,
    hold_script,
    leftovers,
    release,
    sbatch,
    wait_done,
    wait_started,
)
from tests.support.ci import unavailable

pytestmark = pytest.mark.slurm

#: the old version: main as it stood before issues 21-25
OLD = "2f0b9f2"
TRAYS = NODES[:2]


def _export_old(dest: Path) -> None:
    """The old version's package, from git history (a shallow clone may lack it: then skip, or fail in CI)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", OLD, "imexctl"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        why = f"git archive {OLD} failed (a shallow clone?): {done.stderr.decode(errors='replace')[-300:]}"
        unavailable(why)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest)  # noqa: S202 (our own history, from git archive)


@pytest.fixture(scope="module")
def switch(lab: SlurmLab) -> Iterator[Path]:
    """The lab's Prolog as a switch between the old tree and this checkout's hook; the switch file's path."""
    old = lab.dir / "old"
    _export_old(old)
    flag = lab.dir / "use-old-prolog"
    script = lab.dir / "bin" / "prolog-switch"
    new = lab.slurm.path_inside(REPO / "hooks" / "prolog")
    script.write_text(
        "#!/bin/sh\n"
        f'if [ -e {flag} ]; then\n  touch {lab.dir}/out/old-prolog-"$SLURM_JOB_ID"\n'
        f"  PYTHONPATH={old} exec {IMEXCTL_PREFIX}/bin/python -m imexctl prolog\nfi\nexec {new}\n"
    )
    os.chmod(script, 0o755)
    before = lab.prolog
    lab.prolog = script
    lab.restart(lab.extra_conf, lab.extra_etc)
    try:
        yield flag
    finally:
        flag.unlink(missing_ok=True)
        lab.prolog = before
        lab.restart(lab.extra_conf, lab.extra_etc)


def test_old_prolog_then_new_epilog_leaves_the_tray_clean(lab: SlurmLab, switch: Path) -> None:
    """Old prolog sets the domain up; the upgrade happens; the new epilog tears it down; the next job runs."""
    switch.touch()
    job = sbatch(lab, hold_script(lab), TRAYS)
    try:
        wait_started(lab, job)
        for node in TRAYS:
            assert_domain_up(ctl_domain(lab, node, job), len(TRAYS), f"job {job} on {node} (old prolog)")
        assert (lab.dir / "out" / f"old-prolog-{job}").exists(), "the old version's prolog did not run"
        switch.unlink()  # the upgrade, while the job runs
    finally:
        release(lab, job)
    wait_done(lab, job)
    for node in TRAYS:
        done = events(lab, node, job, "epilog.done")[-1]
        assert done["ok"] is True and any("stop daemon" in a for a in done["actions"]), f"{node}: {done}"
        assert leftovers(lab, node) == [], f"{node} not clean after the new epilog of job {job}"
    nxt = sbatch(lab, "true", TRAYS)
    wait_done(lab, nxt)
    assert not (lab.dir / "out" / f"old-prolog-{nxt}").exists()
    for node in TRAYS:
        assert events(lab, node, nxt, "prolog.done")[-1]["ok"] is True, node
        assert leftovers(lab, node) == [], node
