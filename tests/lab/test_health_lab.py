"""imexctl health and doctor while jobs start and end on a tray, under the real slurmd (issue 34).

The simulated daemons start slowly and stop slowly (``slow_start``, ``stop_delay``), so the prologs and
epilogs hold the node lock for seconds at a time.  First an admin's loop on node1, ``imexctl health`` then
``imexctl doctor`` back to back while two-tray jobs start and end there: never a fault, never a drain, and
doctor's job checks never FAIL.  Then slurmd itself runs the health check (``HealthCheckProgram``,
``HealthCheckInterval=2``; on 26.05 with ``SlurmctldParameters=health_check_report``, so slurmd passes
``SLURM_NODE_IS_HEALTHY``) while jobs run: every run healthy, no node drained; then a config that does not
load drains every tray with health's own reason (``imexh:``, issue 42), which ``imexctl drains`` folds by
block; a tag another tool adds to one tray's reason leaves it health's, an admin's reason on another is never
health's; once the config loads again health resumes its own trays, the tagged one included, and only those.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import IMEXCTL, drains_view, imexctl_admin, sbatch, wait_done
from tests.simhelpers import wait_for

pytestmark = pytest.mark.slurm

TRAYS = NODES[:2]
TRAY = NODES[0]
FAULTS = "slow_start=1.5\nstop_delay=1\n"
JOBS = 4


def _jobs(lab: SlurmLab, count: int) -> list[int]:
    """Two-tray jobs one after the other on node1 and node2, each waited for."""
    done = []
    for _ in range(count):
        job = sbatch(lab, "sleep 1", TRAYS)
        wait_done(lab, job, timeout=90)
        done.append(job)
    return done


def test_health_and_doctor_in_a_loop_never_fail_a_healthy_tray(lab: SlurmLab) -> None:
    """While jobs start and end on node1: every health run is healthy (some while a hook is in flight or a
    domain runs), doctor's imexctl.stale and imexctl.channels never FAIL, node1 is never drained."""
    lab.faults.write_text(FAULTS)
    stop = threading.Event()
    seen: list[dict[str, Any]] = []

    def loop() -> None:
        while not stop.is_set():
            health = imexctl_admin(lab, TRAY, "health", "--json", check=False)
            doctor = imexctl_admin(lab, TRAY, "doctor", "--json", check=False)
            seen.append({"health": health, "doctor": doctor, "state": lab.node_states().get(TRAY, {})})

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        jobs = _jobs(lab, JOBS)
    finally:
        stop.set()
        thread.join(timeout=180)
    assert len(seen) >= 3, f"only {len(seen)} rounds of health and doctor ran during {JOBS} jobs"
    busy = 0
    for i, rec in enumerate(seen):
        h = rec["health"]
        assert h.returncode == 0, f"round {i}: health exit {h.returncode}: {h.stdout}{h.stderr}"
        data = json.loads(h.stdout)["data"]
        assert data["healthy"] and data["findings"] == [], data
        assert data["slurm"]["action"] == "none", data["slurm"]
        checks = {c["name"]: c for c in json.loads(rec["doctor"].stdout)["data"]}
        for name in ("imexctl.stale", "imexctl.channels"):
            if name in checks:
                assert checks[name]["status"] != "FAIL", f"round {i}: {checks[name]}"
        busy += bool(data["in_progress"] or not data["idle"])
        assert not rec["state"].get("state", "").startswith("drain"), f"round {i}: {rec['state']}"
    assert busy, "no health run overlapped a hook or a running domain: the loop proved nothing"
    print(f"{len(seen)} rounds of health and doctor on {TRAY}, {busy} while a hook ran or a domain was up")
    assert all(lab.node_states()[n]["state"] == "idle" for n in TRAYS), lab.node_states()
    story = imexctl_admin(lab, TRAY, "why", str(jobs[-1]))
    assert story.stdout.startswith(f"job {jobs[-1]} on {TRAY}: set up, torn down\n"), story.stdout


def _wrapper(lab: SlurmLab) -> Path:
    """The lab's HealthCheckProgram: records what slurmd gave it, runs imexctl health with the lab's files.

    Each run writes a file of its own, named by when it started (``/proc/uptime``) and its pid: slurmd may
    start a run while another still runs (its timer's and one slurmctld asks for, on a loaded machine), and
    their lines must not interleave.
    """
    script = lab.dir / "bin" / "health-check"
    out = lab.dir / "out"
    script.write_text(
        "#!/bin/sh\n"
        "# slurmd runs this with no arguments and no PATH: SLURMD_NODENAME and maybe SLURM_NODE_IS_HEALTHY\n"
        "read -r up _ < /proc/uptime\n"
        f'log={out}/health-"$SLURMD_NODENAME"-"$up"-$$.run\n'
        'echo "run node=$SLURMD_NODENAME healthy=${SLURM_NODE_IS_HEALTHY-unset} path=${PATH-unset}" > "$log"\n'
        f'SLURM_CONF={lab.conf} {IMEXCTL} --config {lab.imexctl_conf} health >> "$log" 2>&1\n'
        'rc=$?\necho "rc=$rc" >> "$log"\nexit $rc\n'
    )
    script.chmod(0o755)
    return script


def _runs(lab: SlurmLab, node: str) -> list[list[str]]:
    """Each finished health check run on a node, in the order they started: its lines, 'run ...' to 'rc=N'."""
    found = []
    for path in (lab.dir / "out").glob(f"health-{node}-*.run"):
        up, pid = path.name[len(f"health-{node}-") : -len(".run")].rsplit("-", 1)
        lines = path.read_text().splitlines()
        if lines and lines[0].startswith("run ") and lines[-1].startswith("rc="):
            found.append((float(up), int(pid), lines))
    return [lines for _, _, lines in sorted(found)]


@pytest.fixture
def health_check(lab: SlurmLab) -> Iterator[Path]:
    """slurm.conf with imexctl health as HealthCheckProgram every 2 s, for the test; then as before."""
    before = lab.extra_conf, dict(lab.extra_etc)
    script = _wrapper(lab)
    report = "SlurmctldParameters=health_check_report\n" if lab.version_info >= (26, 5) else ""
    conf = lab.imexctl_conf.read_text()
    program = lab.slurm.path_inside(script)
    lab.restart(f"{before[0]}HealthCheckProgram={program}\nHealthCheckInterval=2\n{report}", before[1])
    try:
        yield script
    finally:
        lab.imexctl_conf.write_text(conf)
        lab.restart(*before)


def test_slurmds_health_check_drains_only_a_fault_and_resumes_it(lab: SlurmLab, health_check: Path) -> None:
    lab.faults.write_text(FAULTS)
    _jobs(lab, 3)
    wait_for(lambda: all(len(_runs(lab, n)) >= 3 for n in NODES), 60, 0.5, what="three health checks per node")
    given = "yes" if lab.version_info >= (26, 5) else "unset"
    for node in NODES:
        runs = _runs(lab, node)
        for run in runs:
            assert run[-1] == "rc=0" and run[1].startswith(f"healthy {node}: "), run
        # slurmd's own start runs it before slurmctld has a view: unset then; afterwards what the version gives
        assert {r[0].split()[2] for r in runs[1:]} == {f"healthy={given}"}, [r[0] for r in runs]
        if given == "yes":  # a healthy tray in service: slurmctld never asked
            assert all(r[-2] == "slurm: none: healthy, and in service" for r in runs[1:]), runs
    assert not [n for n, st in lab.node_states().items() if st["state"].startswith("drain")], lab.node_states()
    print(
        f"health checks by slurmd: {', '.join(f'{n} {len(_runs(lab, n))}' for n in NODES)}, SLURM_NODE_IS_HEALTHY={given}"
    )

    # a fault of every tray: the config no longer loads
    good = lab.imexctl_conf.read_text()
    lab.imexctl_conf.write_text(good + "[readiness]\ndeadline_s = soon\n")

    def drained() -> bool:
        states = lab.node_states()
        return all(states[n]["state"].startswith("drain") and states[n]["reason"].startswith("imexh:") for n in NODES)

    wait_for(drained, 60, 0.5, what="every tray drained by imexctl health")
    reasons = {n: st["reason"] for n, st in lab.node_states().items()}
    assert all(reasons[n].startswith(f"imexh:config_invalid {n}: ") for n in NODES), reasons
    shown = lab.run(["sinfo", "-R", "-h"]).stdout  # sinfo -R's 20 columns hold the whole code
    assert shown.count("imexh:config_invalid ") == len(NODES), shown
    # another tool tags node1's reason (NVIDIA's Remediation Orchestrator, a ticket); an admin takes node4 over
    tagged = f"[ticket-7] {reasons[TRAY]} [RO:reboot]"
    admin = "bad DIMM, ticket 4711"
    lab.run(["scontrol", "update", f"nodename={TRAY}", f"reason={tagged}"])
    lab.run(["scontrol", "update", f"nodename={NODES[3]}", "state=drain", f"reason={admin}"])
    runs = len(_runs(lab, TRAY))
    wait_for(lambda: len(_runs(lab, TRAY)) >= runs + 2, 60, 0.5, what=f"two more health checks on {TRAY}")
    assert lab.node_states()[TRAY]["reason"] == tagged, "health replaced its own reason with a tag added"
    view = drains_view(lab)
    groups = [(g["label"], g["block"], g["trays"], g["nodes"]) for g in view["groups"]]
    assert groups == [
        ("imexh:config_invalid", "b1", 2, "node[1-2]"),
        ("imexh:config_invalid", "b2", 1, "node3"),
        (f"other: {admin}", "b2", 1, "node4"),
    ], groups
    lab.imexctl_conf.write_text(good)
    started = time.monotonic()
    lab.wait_idle(NODES[:3], timeout=60)
    resumed = [r for n in NODES for r in _runs(lab, n) if "slurm: resumed: the fault (config_invalid) is gone" in r]
    assert len(resumed) >= 3, f"resumed by health: {len(resumed)} in {time.monotonic() - started:.0f} s"
    runs = len(_runs(lab, NODES[3]))
    wait_for(lambda: len(_runs(lab, NODES[3])) >= runs + 2, 60, 0.5, what=f"two more health checks on {NODES[3]}")
    assert lab.node_states()[NODES[3]] == {"state": "drain", "reason": admin}, lab.node_states()
    lab.run(["scontrol", "update", f"nodename={NODES[3]}", "state=resume"])
    lab.wait_idle(timeout=30)
    print(f"drained: {reasons[TRAY]!r}; tagged and resumed by health within {time.monotonic() - started:.0f} s")
