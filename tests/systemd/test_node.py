"""The systemd backend on booted nodes: real systemd as PID 1, slurmd as a service, units started by the prolog.

Each test reads its outcome from systemd itself (``systemctl show``, ``is-active``, ``list-units``, the
journal) on the node where it happened; imexctl's own log is read only where the test is about what imexctl
reports. The lab: tests/systemd/conftest.py and tests/lab/sysd.py.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from typing import Any

import pytest

from tests.lab.jobs import (
    UID,
    JobEnded,
    assert_domain_up,
    events,
    hold_script,
    read_steps,
    release,
    sbatch,
    srun_check,
    step_argv,
    wait_done,
    wait_started,
    wait_state,
)
from tests.lab.sysd import SystemdLab
from tests.simhelpers import wait_for
from tests.systemd.nodes import NODES, UNITS, restore, retire_stock

pytestmark = pytest.mark.systemd

CTL = "/usr/bin/nvidia-imex-ctl"
STOCK = "nvidia-imex.service"


def show(lab: SystemdLab, node: str, unit: str, *props: str) -> dict[str, str]:
    return lab.node(node).show(unit, *props)


def is_active(lab: SystemdLab, node: str, unit: str) -> str:
    return lab.node(node).exec(["systemctl", "is-active", unit], check=False).stdout.strip()


def units(lab: SystemdLab, node: str) -> list[str]:
    """The job units systemd has loaded on a node, whatever their state."""
    return lab.node(node).units(UNITS)


def hold(lab: SystemdLab, nodes: Sequence[str], extra: Sequence[str] = ()) -> int:
    """Start a batch job on these nodes that runs until released; return once every prolog has succeeded."""
    job = sbatch(lab, hold_script(lab), nodes, extra=extra)
    wait_started(lab, job)
    return job


def status_of(lab: SystemdLab, node: str, job: int) -> dict[str, Any]:
    """`imexctl status --json` on a node: the entry of one job."""
    res = lab.imexctl(node, "status", "--json", check=True)
    return next(j for j in json.loads(res.stdout)["data"]["jobs"] if j["job_id"] == job)


def in_container(lab: SystemdLab, node: str, path: str) -> str:
    return lab.node(node).exec(["cat", path]).stdout


def journal(lab: SystemdLab, node: str, unit: str) -> list[dict[str, Any]]:
    """The unit's journal entries of this boot (JSON)."""
    res = lab.node(node).exec(["journalctl", "-b", "-u", unit, "-o", "json", "--no-pager"], timeout=30)
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def when(entries: list[dict[str, Any]], text: str) -> float:
    """Seconds (realtime) of the first journal entry whose message contains ``text``."""
    for e in entries:
        if text in str(e.get("MESSAGE", "")):
            return int(e["__REALTIME_TIMESTAMP"]) / 1e6
    raise AssertionError(f"no journal entry with {text!r}: {[e.get('MESSAGE') for e in entries]}")


# ---------------------------------------------------------------- a job's life


def test_multi_node_job_runs_one_unit_per_node_and_leaves_none(sysd: SystemdLab) -> None:
    """Both prologs start imexctl-imex@<job>.service; the domain is UP and the job step sees its channel;
    after the epilogs no unit of the job is loaded, active or failed."""
    wrap = shlex.join(step_argv(sysd, NODES, "--ctl", CTL, "--hold"))
    job = sbatch(sysd, wrap, NODES)
    steps = wait_for(lambda: read_steps(sysd, NODES), 60, 0.2, what=f"job {job}'s step on every node")
    unit = sysd.unit(job)
    for node in NODES:
        assert is_active(sysd, node, unit) == "active", node
        props = show(sysd, node, unit, "ActiveState", "SubState", "MainPID", "ControlGroup", "Type", "Result")
        assert props["SubState"] == "running" and props["Type"] == "simple", props
        assert props["ControlGroup"].endswith(f"/{unit}"), props
        argv = in_container(sysd, node, f"/proc/{props['MainPID']}/cmdline").split("\0")
        assert f"/run/imexctl/jobs/{job}/config.cfg" in argv, argv
        step = steps[node]
        assert step["job"] == job and step["uid"] == UID
        assert step["ctl"]["rc"] == 0, step["ctl"]
        assert_domain_up(json.loads(step["ctl"]["stdout"]), len(NODES), f"{node} (seen by the job step)")
        (chan,) = step["channels"]
        assert (chan["chr"], chan["major"], chan["uid"], chan["mode"]) == (True, 234, UID, 0o600), chan
    release(sysd, job)
    wait_done(sysd, job)
    for node in NODES:
        assert units(sysd, node) == [], node
        assert not (sysd.node_root(node) / f"run/imexctl/jobs/{job}").exists()
        assert list((sysd.node_root(node) / "dev/nvidia-caps-imex-channels").glob("channel*")) == []


def test_daemon_output_goes_to_the_journal_and_the_imex_log(sysd: SystemdLab) -> None:
    """docs/install.md: the daemon's stdout/stderr go to the unit's journal, its own log to imex_log_file."""
    job = hold(sysd, ["node1"])
    unit = sysd.unit(job)
    try:
        entries = journal(sysd, "node1", unit)
        said = [e for e in entries if "lab stand-in /usr/bin/nvidia-imex" in str(e.get("MESSAGE", ""))]
        assert said, [e.get("MESSAGE") for e in entries]
        assert said[0]["_SYSTEMD_UNIT"] == unit and said[0]["_TRANSPORT"] == "stdout", said[0]
        assert f"-c /run/imexctl/jobs/{job}/config.cfg" in said[0]["MESSAGE"]
        assert when(entries, "Started") <= when(entries, "lab stand-in")
        text = in_container(sysd, "node1", "/var/log/nvidia-imex.log")
        assert f"/run/imexctl/jobs/{job}/nodes_config.cfg" in text and "IMEX Log initializing" in text
    finally:
        release(sysd, job)
    wait_done(sysd, job)
    stopped = journal(sysd, "node1", unit)
    assert when(stopped, "Stopping") <= when(stopped, "Stopped")


# ---------------------------------------------------------------- a daemon that misbehaves


def test_daemon_that_hangs_on_stop_gets_sigkill_after_timeoutstopsec(sysd: SystemdLab) -> None:
    """A daemon that ignores SIGTERM: systemd kills it TimeoutStopSec (15 s) after the stop began, the unit's
    result is 'timeout', the epilog says so in its actions, and reset-failed leaves nothing loaded."""
    sysd.set_faults("node2", "ignore_sigterm")
    job, _ = srun_check(sysd, NODES)
    unit = sysd.unit(job)
    wait_for(lambda: units(sysd, "node2") == [], 60, 0.5, what=f"{unit} to be gone from node2")
    entries = journal(sysd, "node2", unit)
    stop_timeout = show(sysd, "node2", unit, "TimeoutStopUSec")["TimeoutStopUSec"]
    assert stop_timeout == "15s"
    waited = when(entries, "State 'stop-sigterm' timed out. Killing.") - when(entries, "Stopping")
    assert 14.5 <= waited <= 20, waited
    assert when(entries, "with signal SIGKILL") and when(entries, "Failed with result 'timeout'")
    (done,) = events(sysd, "node2", job, "epilog.done")
    assert done["ok"] and done["actions"][0] == (
        f"stop daemon of job {job} ({unit}: systemd sent SIGKILL after the stop timeout)"
    ), done
    wait_done(sysd, job)
    assert sysd.node_states()["node2"]["state"] == "idle"


def test_daemon_crash_leaves_a_failed_unit_that_status_shows_and_the_epilog_clears(sysd: SystemdLab) -> None:
    """The daemon dies mid-job (exit 134): its unit is failed (Restart=no), `imexctl status` shows it
    failed, and the epilog's stop and reset-failed leave no unit behind."""
    sysd.set_faults("node2", "crash_after=8")
    job = hold(sysd, NODES)
    unit = sysd.unit(job)
    try:
        wait_for(lambda: is_active(sysd, "node2", unit) == "failed", 30, 0.5, what=f"{unit} to fail")
        props = show(sysd, "node2", unit, "Result", "ExecMainStatus", "SubState")
        assert props == {"Result": "exit-code", "ExecMainStatus": "134", "SubState": "failed"}, props
        daemon = status_of(sysd, "node2", job)["daemon"]
        assert (daemon["unit"], daemon["state"], daemon["pid"]) == (unit, "failed/failed", None), daemon
        assert is_active(sysd, "node1", unit) == "active"
    finally:
        release(sysd, job)
    wait_done(sysd, job)
    for node in NODES:
        assert units(sysd, node) == [], node


def test_daemon_sigkilled_mid_job_leaves_no_failed_unit_after_the_epilog(sysd: SystemdLab) -> None:
    """`systemctl kill -s KILL` on the job's daemon (first-rack.md step 7): the unit is failed (result signal);
    the epilog's stop leaves a failed unit failed, its reset-failed does not: no unit of the job is left, so a
    health agent that watches units has nothing to drain the node for."""
    job = hold(sysd, NODES)
    unit = sysd.unit(job)
    try:
        sysd.node("node2").exec(["systemctl", "kill", "-s", "KILL", unit])
        wait_for(lambda: is_active(sysd, "node2", unit) == "failed", 30, 0.5, what=f"{unit} to fail")
        assert show(sysd, "node2", unit, "Result", "ExecMainStatus") == {"Result": "signal", "ExecMainStatus": "9"}
    finally:
        release(sysd, job)
    wait_done(sysd, job)
    for node in NODES:
        assert units(sysd, node) == [], node
        assert is_active(sysd, node, unit) == "inactive", node
    assert sysd.node_states()["node2"]["state"] == "idle"


def test_daemon_imexctl_had_to_kill_leaves_no_failed_unit(sysd: SystemdLab) -> None:
    """A daemon that ignores SIGTERM and a systemctl stop cut short by imexctl's own bound ([daemon]
    stop_timeout_s = 1: systemctl gets 6 s, the unit's TimeoutStopSec is 15 s): the epilog kills the daemon
    itself (SIGKILL after kill_grace_s), which leaves the unit failed; it then resets it: no unit is left."""
    conf = sysd.node_root("node2") / "etc/imexctl/imexctl.conf"
    before = conf.read_text()
    conf.write_text(before + "\n[daemon]\nstop_timeout_s = 1\nkill_grace_s = 1\n")
    sysd.set_faults("node2", "ignore_sigterm")
    try:
        job, _ = srun_check(sysd, NODES)
        wait_done(sysd, job)
    finally:
        conf.write_text(before)
    (done,) = events(sysd, "node2", job, "epilog.done")
    stop = done["actions"][0]
    assert done["ok"] and "systemctl stop" in stop and "SIGKILL to pid" in stop, done
    assert "still" not in stop, stop  # forget() found the unit settled
    assert units(sysd, "node2") == [] and is_active(sysd, "node2", sysd.unit(job)) == "inactive"
    assert sysd.node_states()["node2"]["state"] == "idle"


# ---------------------------------------------------------------- slurmd and the stock unit


def test_restarting_slurmd_leaves_the_imex_unit_running(sysd: SystemdLab) -> None:
    """The daemon lives in its unit's cgroup, not slurmd's: `systemctl restart slurmd` mid-job leaves the
    same daemon running, and the job's epilog (run by the new slurmd) still stops it."""
    job = hold(sysd, NODES)
    unit = sysd.unit(job)
    try:
        before = show(sysd, "node1", unit, "MainPID", "InvocationID", "ControlGroup")
        slurmd = show(sysd, "node1", "slurmd.service", "MainPID", "ControlGroup", "KillMode")
        assert slurmd["KillMode"] == "process" and not before["ControlGroup"].startswith(slurmd["ControlGroup"])
        cgroups = in_container(sysd, "node1", f"/proc/{before['MainPID']}/cgroup")
        assert f"/{unit}\n" in cgroups and "slurmd.service" not in cgroups, cgroups
        sysd.node("node1").exec(["systemctl", "restart", "slurmd.service"], timeout=60)
        after_slurmd = show(sysd, "node1", "slurmd.service", "MainPID", "ActiveState")
        assert after_slurmd["ActiveState"] == "active" and after_slurmd["MainPID"] != slurmd["MainPID"]
        assert show(sysd, "node1", unit, "MainPID", "InvocationID", "ControlGroup") == before
        assert is_active(sysd, "node1", unit) == "active"
    finally:
        release(sysd, job)
    wait_done(sysd, job)
    for node in NODES:
        assert units(sysd, node) == [], node


def test_running_stock_unit_makes_the_prolog_refuse_and_leave_nothing(sysd: SystemdLab) -> None:
    """With the stock nvidia-imex.service running the prolog refuses (domain_busy, naming the unit); the
    stock unit keeps running, no job unit is loaded, nothing of the job is left, the node drains with the
    prolog's own reason."""
    node = sysd.node("node1")
    node.exec(["systemctl", "unmask", STOCK])
    node.exec(["systemctl", "start", STOCK])
    try:
        res = sysd.run(["srun", "-N1", "-w", "node1", "-t", "2", "true"], user=UID, check=False, timeout=120)
        assert res.returncode != 0, res.stdout + res.stderr
        done = events(sysd, "node1", event="prolog.done")[-1]
        assert (done["ok"], done["error_code"], done["exit_code"]) == (False, "domain_busy", 69), done
        assert done["reason"].startswith(f"{STOCK} is running: disable it"), done
        job = int(done["job_id"])
        assert is_active(sysd, "node1", STOCK) == "active"
        assert units(sysd, "node1") == []
        assert not (sysd.node_root("node1") / f"run/imexctl/jobs/{job}").exists()
        assert list((sysd.node_root("node1") / "dev/nvidia-caps-imex-channels").glob("channel*")) == []
        assert STOCK in show(sysd, "node1", sysd.unit(job), "Conflicts")["Conflicts"].split()
        # the prolog drains its node with its own reason first, which slurmctld keeps (issue 34 §1)
        want = f"imex:domain_busy node1 job {job}: {STOCK} is running: disable it"
        wait_for(lambda: sysd.node_states()["node1"]["reason"].startswith(want), 30, what="node1 drained")
    finally:
        restore(sysd, "node1")


def test_starting_the_stock_unit_stops_a_running_jobs_daemon(sysd: SystemdLab) -> None:
    """Conflicts= works the other way too: starting nvidia-imex.service makes systemd stop the job's unit;
    `imexctl status` shows the unit inactive, and the epilog still cleans up."""
    job = hold(sysd, ["node2"])
    unit = sysd.unit(job)
    node = sysd.node("node2")
    try:
        assert show(sysd, "node2", STOCK, "ConflictedBy")["ConflictedBy"] == unit
        node.exec(["systemctl", "unmask", STOCK])
        node.exec(["systemctl", "start", STOCK])
        assert is_active(sysd, "node2", STOCK) == "active"
        # the stop of the conflicting unit is part of the same transaction, but may finish after the start
        wait_for(lambda: is_active(sysd, "node2", unit) == "inactive", 30, 0.2, what=f"{unit} stopped by systemd")
        assert status_of(sysd, "node2", job)["daemon"]["state"] == "inactive/dead"
    finally:
        retire_stock(sysd, "node2")
        release(sysd, job)
    wait_done(sysd, job)
    assert units(sysd, "node2") == []
    assert not (sysd.node_root("node2") / f"run/imexctl/jobs/{job}").exists()
    (done,) = events(sysd, "node2", job, "epilog.done")
    assert done["ok"] and f"remove /run/imexctl/jobs/{job}" in done["actions"], done


# ---------------------------------------------------------------- a reboot


def lost_batch_after(lab: SystemdLab) -> int:
    """Seconds a batch job must have run before slurmctld takes it for lost when its node re-registers
    without it: BatchStartTimeout + MessageTimeout (observed with 24.11: 11 s was too early, 22 s enough)."""
    lines = lab.run(["scontrol", "show", "config"]).stdout.splitlines()
    conf = {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in lines)}
    return sum(int(conf[key].split()[0]) for key in ("BatchStartTimeout", "MessageTimeout"))


def test_power_loss_mid_job_is_cleaned_before_slurmd_and_the_node_comes_back_idle(sysd: SystemdLab) -> None:
    """Pull the batch node's plug mid-job and boot it again: imexctl-cleanup.service ran and finished before
    slurmd started, and no unit of the job exists there; slurmctld finds the batch job gone (NODE_FAIL),
    the other node's epilog stops its unit, and both nodes are idle and clean."""
    job = hold(sysd, NODES, extra=["--no-requeue"])
    # slurmctld takes a batch job for lost only once it has run a while (FAQ #batch_lost); a reboot earlier
    # leaves the job running until slurmctld asks the node again, minutes later
    window = lost_batch_after(sysd)
    time.sleep(window + 2)
    plugged = time.monotonic()
    sysd.reboot("node1", clean=False)
    cleanup = show(sysd, "node1", "imexctl-cleanup.service", "ActiveState", "Result", "ExecMainStatus")
    assert cleanup == {"ActiveState": "active", "Result": "success", "ExecMainStatus": "0"}, cleanup
    finished = int(show(sysd, "node1", "imexctl-cleanup.service", "ActiveEnterTimestampMonotonic")[
        "ActiveEnterTimestampMonotonic"])  # fmt: skip
    slurmd = show(sysd, "node1", "slurmd.service", "InactiveExitTimestampMonotonic", "After")
    assert 0 < finished <= int(slurmd["InactiveExitTimestampMonotonic"]), (finished, slurmd)
    assert "imexctl-cleanup.service" in slurmd["After"].split()
    assert units(sysd, "node1") == []
    try:
        ended = wait_state(sysd, job, ["NODE_FAIL"], timeout=20)
    except JobEnded:
        raise
    except AssertionError:
        # slurmctld also asks each node to register every 20 pings (ping_nodes.c, MAX_REG_FREQUENCY; 200 s
        # here); one that fell in the job's last `window` seconds before the plug was pulled told it the job
        # was alive then (time_last_active), so the boot's registration was too early to purge it
        # (job_mgr.c, _purge_missing_jobs).  Register once more after the window, as the next periodic
        # request would minutes later.
        time.sleep(max(0.0, plugged + window + 2 - time.monotonic()))
        sysd.node("node1").exec(["systemctl", "restart", "slurmd.service"], check=True)
        ended = wait_state(sysd, job, ["NODE_FAIL"], timeout=60)
    assert ended["JobState"] == "NODE_FAIL", ended
    sysd.wait_idle(timeout=60)
    for node in NODES:
        assert units(sysd, node) == [], node
        assert not (sysd.node_root(node) / f"run/imexctl/jobs/{job}").exists()
    (done,) = events(sysd, "node2", job, "epilog.done")
    assert done["ok"] and f"stop daemon of job {job}" in done["actions"], done
