"""The live-gauge timer on booted nodes (issue 35 item 1): imexctl-metrics.timer refreshes imexctl-live.prom every
15 s; a job's daemon killed mid-job shows as lost within a minute, while the hooks' file learns it only at the
epilog. The lab: tests/systemd/conftest.py and tests/lab/sysd.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl.platform.fsutil import atomic_write
from tests.lab.jobs import hold_script, release, sbatch, wait_done, wait_started
from tests.lab.sysd import SystemdLab
from tests.simhelpers import wait_for
from tests.systemd.nodes import NODES

pytestmark = pytest.mark.systemd

TEXTFILE_DIR = "/var/lib/node_exporter"
CONF = "etc/imexctl/imexctl.conf"
UNITS = ("imexctl-metrics.service", "imexctl-metrics.timer")


def gauges(
    lab: SystemdLab, node: str, name: str = "imexctl-live.prom"
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample, labels) -> value of one of the node's files; labels include block."""
    path = lab.node_root(node) / TEXTFILE_DIR.lstrip("/") / name
    if not path.exists():
        return {}
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    for (sample, got), v in found.items():
        if sample == name and {k: w for k, w in got if k != "block"} == labels:
            return v
    return None


@pytest.fixture
def live_timer(sysd: SystemdLab) -> Iterator[None]:
    """[metrics] textfile_dir set and the timer enabled on every node, as docs/metrics.md says; undone after."""
    saved = {}
    for n in NODES:
        m = sysd.node(n)
        conf = m.merged / CONF
        saved[n] = conf.read_text()
        atomic_write(conf, saved[n] + f"\n[metrics]\ntextfile_dir = {TEXTFILE_DIR}\n", mode=0o644)
        m.exec(["install", "-d", "-m", "0755", TEXTFILE_DIR])
        # the package's units: from the node's copy of the checkout, where the packages take them
        m.shell("install -m 0644 systemd/imexctl-metrics.service systemd/imexctl-metrics.timer /etc/systemd/system/",
                cwd="/usr/local/src/imexctl")  # fmt: skip
        m.exec(["systemctl", "daemon-reload"])
        m.exec(["systemctl", "enable", "--now", "imexctl-metrics.timer"])
    try:
        yield
    finally:
        for n in NODES:
            m = sysd.node(n)
            m.exec(["systemctl", "disable", "--now", "imexctl-metrics.timer"], check=False)
            m.exec(["rm", "-f", *(f"/etc/systemd/system/{u}" for u in UNITS)], check=False)
            m.exec(["rm", "-rf", TEXTFILE_DIR], check=False)
            m.exec(["systemctl", "daemon-reload"], check=False)
            atomic_write(m.merged / CONF, saved[n], mode=0o644)


def test_a_killed_daemon_shows_as_lost_within_a_minute(sysd: SystemdLab, live_timer: None) -> None:
    """With the timer on: the running job's domain reads up with its peer connected; SIGKILL to node2's daemon
    shows as imexctl_live_daemon_lost 1 (domain down) on node2 within 60 s, and node1's daemon reports its peer
    gone; the hooks' file still counts nothing lost until the epilog, which then counts it; after the job the
    live gauges read idle again."""
    job = sbatch(sysd, hold_script(sysd), NODES)
    wait_started(sysd, job)
    unit = sysd.unit(job)
    try:
        for n in NODES:
            # the first refresh may come while the daemons still connect (degraded): the gauges are live
            live = wait_for(
                lambda n=n: (g := gauges(sysd, n))
                and value(g, "imexctl_live_domain_owner_job") == job
                and value(g, "imexctl_live_domain_state", state="up") == 1
                and g,
                60, 0.5, what=f"{n}'s live gauges to show job {job}'s domain up",
            )  # fmt: skip
            assert value(live, "imexctl_live_domain_peers") == value(live, "imexctl_live_domain_peers_connected") == 1
            assert value(live, "imexctl_live_daemon_lost") == 0
            assert {dict(labels).get("block") for _, labels in live} == {None}, "fabric = none, no topology file"
        timer = sysd.node("node2").show("imexctl-metrics.timer", "ActiveState", "UnitFileState")
        assert timer == {"ActiveState": "active", "UnitFileState": "enabled"}, timer
        sysd.node("node2").exec(["systemctl", "kill", "--signal=SIGKILL", unit])
        killed = time.monotonic()
        wait_for(lambda: value(gauges(sysd, "node2"), "imexctl_live_daemon_lost") == 1, 60, 0.5,
                 what="node2's live gauges to count the daemon lost")  # fmt: skip
        took = time.monotonic() - killed
        live = gauges(sysd, "node2")
        assert value(live, "imexctl_live_domain_state", state="down") == 1 and took < 60, (took, live)
        assert value(gauges(sysd, "node2", "imexctl.prom"), "imexctl_daemon_lost_total") == 0, "not before the epilog"
        peer = wait_for(
            lambda: (g := gauges(sysd, "node1")) and (value(g, "imexctl_live_domain_peers_connected") or 0) < 1 and g,
            60, 0.5, what="node1's daemon to report its peer gone",
        )  # fmt: skip
        assert value(peer, "imexctl_live_daemon_lost") == 0 and value(peer, "imexctl_live_domain_owner_job") == job
    finally:
        release(sysd, job)
    wait_done(sysd, job)
    assert value(gauges(sysd, "node2", "imexctl.prom"), "imexctl_daemon_lost_total") == 1
    for n in NODES:
        idle = wait_for(
            lambda n=n: (g := gauges(sysd, n)) and value(g, "imexctl_live_domain_state", state="none") == 1 and g,
            60, 0.5, what=f"{n}'s live gauges to read idle",
        )  # fmt: skip
        assert value(idle, "imexctl_live_daemon_lost") == value(idle, "imexctl_live_stale", kind="job") == 0
