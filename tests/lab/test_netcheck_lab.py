"""``imexctl netcheck`` as one job step under the real slurmd, as an admin runs it on a new rack (issue 22).

``srun -p shared -N4 --ntasks-per-node=1 imexctl netcheck`` as the lab's unprivileged user, in the partition
where jobs may share their trays (so the netcheck job itself gets no IMEX domain): every tray listens on a
port of each per-job range and connects to every other tray; the step's first tray prints the matrix.
Then node3's namespace gets a firewall that lets only the stock daemon's 50000/50005 through and drops the
per-job ranges, as many sites configure: netcheck exits non-zero and names every blocked pair.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from imexctl.slurm import nodefold
from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import IMEXCTL, UID
from tests.lab.procs import SYS_PATH

pytestmark = pytest.mark.slurm

WALLED = NODES[2]
TABLE = "imexctl_lab_netcheck"
RULES = f"""table inet {TABLE} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "lo" accept
    tcp dport {{ 50000, 50005 }} accept
    tcp dport 61000-62999 drop
  }}
}}
"""


def _netcheck(lab: SlurmLab) -> subprocess.CompletedProcess[str]:
    # partition 'shared': the netcheck job gets no IMEX domain of its own (its prologs would fail first)
    argv = ["srun", "-p", "shared", "-N", str(len(NODES)), "-w", nodefold.fold(NODES), "--ntasks-per-node=1"]
    return lab.run([*argv, str(IMEXCTL), "netcheck", "--timeout", "5"], user=UID, check=False, timeout=180)


@pytest.fixture
def walled(lab: SlurmLab) -> Iterator[str]:
    """node3 with a firewall that admits 50000/50005 and drops 61000-62999, then without."""
    nft = shutil.which("nft", path=SYS_PATH)
    if nft is None:
        pytest.fail("nft missing (apt-get install nftables; .ci/setup installs it)")
    ns = ["ip", "netns", "exec", lab.netns(WALLED), nft]
    subprocess.run([*ns, "-f", "-"], input=RULES, text=True, check=True, timeout=30, capture_output=True)
    try:
        yield WALLED
    finally:
        subprocess.run([*ns, "delete", "table", "inet", TABLE], check=True, timeout=30, capture_output=True)


def test_netcheck_passes_on_an_open_rack(lab: SlurmLab) -> None:
    """Every pair reaches each other on both ranges: exit 0, and the matrix lists every tray."""
    res = _netcheck(lab)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for node in NODES:
        assert node in res.stdout, out
    assert "blocked" not in res.stdout.lower() and "timed out" not in out, out


def test_netcheck_names_the_pairs_a_firewall_blocks(lab: SlurmLab, walled: str) -> None:
    """node3 drops the per-job ranges: non-zero exit, and every pair into node3 is named as blocked."""
    res = _netcheck(lab)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    for node in NODES:
        if node != walled:
            assert f"{node} -> {walled}" in out, f"the pair {node} -> {walled} is not named:\n{out}"
    assert "timed out" in out, out
    assert f"{NODES[0]} -> {NODES[1]}" not in out, f"an open pair was named blocked:\n{out}"
