"""End to end on the simulator: real prolog/epilog processes, real daemons, real TCP.

Every simulated tray has its own root directory and loopback address
(127.0.0.x from a random base) and the same SERVER_PORT, like trays of one rack.
Each test asserts the node state afterwards: no process, file or channel left.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.commands.demo import HookResult, SimRack
from tests.simhelpers import wait_for
from tests.support.racks import JOB_GID, JOB_UID, sim_racks

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog needs root (device nodes, chown)")


@pytest.fixture
def make_rack() -> Iterator[Any]:
    """Build racks under short temporary directories; kill and remove everything afterwards."""
    with sim_racks(SimRack, "imxe") as make:
        yield make


def codes(results: list[HookResult]) -> list[int]:
    return [r.returncode for r in results]


def summary(r: HookResult) -> dict[str, Any]:
    """The last prolog.done / epilog.done line in the tray's JSON log (failures also reach stderr)."""
    log = r.tray.root / "var/log/imexctl.log"
    for line in reversed(log.read_text().splitlines()):
        rec = json.loads(line)
        if rec["event"] in ("prolog.done", "epilog.done"):
            return dict(rec)
    raise AssertionError(f"no summary line in {log}; output: {r.output!r}")


def domain(rack: SimRack, tray: Any, job_id: int) -> dict[str, Any]:
    done = rack.ctl(tray, job_id, "-N", "-j")
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def status(rack: SimRack, tray: Any) -> dict[str, Any]:
    done = rack.imexctl(tray, "status", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["data"])


@pytest.mark.parametrize("trays", [1, 2, 4, 18])
def test_job_gets_a_domain_and_leaves_nothing(make_rack: Any, trays: int) -> None:
    """A job of N trays gets a domain UP on every tray, one channel each, and the epilog removes it all."""
    rack = make_rack(trays, deadline_s=60)
    assert codes(rack.run_hooks("prolog", 500)) == [0] * trays
    minors = set()
    for t in rack.trays:
        cfg = (t.root / "run/imexctl/jobs/500/config.cfg").read_text().splitlines()
        # the command service -N needs: the tray's own address, one explicit port for the job, no socket
        assert {f"IMEX_CMD_BIND_INTERFACE_IP={t.address}", "IMEX_CMD_PORT=62500", "IMEX_CMD_UNIX_DOMAIN_PATH="} <= set(
            cfg
        )
        dom = domain(rack, t, 500)
        assert dom["status"] == "UP"
        assert [n["host"] for _, n in sorted(dom["nodes"].items(), key=lambda kv: int(kv[0]))] == [
            x.address for x in rack.trays
        ]
        assert all(c["status"] == "CONNECTED" for n in dom["nodes"].values() for c in n["connections"].values())
        (chan,) = (t.root / "dev/nvidia-caps-imex-channels").iterdir()
        st = os.lstat(chan)
        assert stat.S_ISCHR(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
            JOB_UID,
            JOB_GID,
            0o600,
        )
        minors.add(os.minor(st.st_rdev))
    assert len(minors) == 1
    assert codes(rack.run_hooks("epilog", 500)) == [0] * trays
    assert rack.leftovers() == []


# imported by a prolog or epilog that does its whole job, they would cost every job start milliseconds of CPU
# on every tray (docs/performance.md "Own CPU"): the hooks use none of them; doctor, netcheck and status may
HOOK_NEVER_IMPORTS = frozenset(
    [
        "argparse",
        "asyncio",
        "dataclasses",
        "datetime",
        "inspect",
        "logging",
        "psutil",
        "pynvml",
        "socket",
        "ssl",
        "structlog",
        "tempfile",
        "tenacity",
    ]
)
# the console script's interpreter (-I), the checkout first on the path; its exit code and what it imported
MODULES_PROBE = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
    "from imexctl.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(json.dumps([rc, sorted(sys.modules)]))\n"
)


def test_a_full_prolog_and_epilog_import_nothing_heavy(make_rack: Any) -> None:
    """A job's whole prolog (domain UP, channel made) and epilog load none of the modules kept off the hooks."""
    rack = make_rack(2, deadline_s=30)
    for hook in ("prolog", "epilog"):
        procs = [
            subprocess.Popen(
                [sys.executable, "-I", "-c", MODULES_PROBE, hook],
                env=rack.job_env(t, 510, hook),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd="/",
            )
            for t in rack.trays
        ]
        for p in procs:
            out, err = p.communicate(timeout=60)
            rc, modules = json.loads(out.splitlines()[-1])
            assert rc == 0, err
            assert HOOK_NEVER_IMPORTS & set(modules) == set(), hook
        if hook == "prolog":
            assert all(domain(rack, t, 510)["status"] == "UP" for t in rack.trays)
    assert rack.leftovers() == []


def test_peer_that_never_starts_times_out_and_rolls_back_everywhere(make_rack: Any) -> None:
    """When one tray's prolog never runs, the others time out within the deadline and roll back."""
    rack = make_rack(3, deadline_s=4)
    present = [rack.trays[0], rack.trays[2]]
    results = _prologs_without(rack, 501, missing=rack.trays[1])
    assert [r.tray for r in results] == present and codes(results) == [75, 75]
    for r in results:
        s = summary(r)
        # gave up at the 4 s deadline and rolled back; without the deadline it would wait for the missing peer
        # until slurmd's PrologTimeout. How precisely the deadline ends the wait is tests/hooks/test_readiness.py's
        # (fake clock); this bound tells a prolog that gave up from one that waits on, with a loaded machine's margin
        assert s["error_code"] == "not_ready" and s["duration_s"] < 4 + 20
    assert rack.leftovers() == []


def _prologs_without(rack: SimRack, job_id: int, *, missing: Any) -> list[HookResult]:
    import subprocess
    import sys

    procs = [
        (
            t,
            subprocess.Popen(
                [sys.executable, "-m", "imexctl", "prolog"],
                env=rack.job_env(t, job_id, "prolog", rack.trays),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd="/",
            ),
        )
        for t in rack.trays
        if t is not missing
    ]
    outputs = [(t, p.communicate()[0].decode(), p) for t, p in procs]  # read before waiting: no pipe deadlock
    return [HookResult(t, p.returncode, out) for t, out, p in outputs]


def test_blocked_command_port_is_named_by_the_other_trays(make_rack: Any) -> None:
    """A tray whose command port the other trays cannot reach (its daemon healthy and connected) keeps the
    domain from looking UP to them; they fail naming that tray and the port, and everything is rolled back."""
    rack = make_rack(3, deadline_s=4)
    blocked = rack.trays[1].address
    rack.set_faults(f"@{blocked} block_cmd")
    results = rack.run_hooks("prolog", 513)
    assert codes(results) == [75, 0, 75]  # the blocked tray itself can ask everyone
    for r in (results[0], results[2]):
        assert f"command port 62513 unreachable on {blocked}" in summary(r)["reason"]
    assert codes(rack.run_hooks("epilog", 513)) == [0, 0, 0]
    assert rack.leftovers() == []


def test_never_ready_peer_fails_every_tray_and_is_named(make_rack: Any) -> None:
    """A tray whose daemon never gets READY fails the job on every tray; the others name it; epilogs clean all."""
    rack = make_rack(3, deadline_s=5)
    bad = rack.trays[1].address
    rack.set_faults(f"@{bad} never_ready")
    results = rack.run_hooks("prolog", 502)
    assert codes(results) == [75, 75, 75]
    assert "local WAITING_FOR_PEERS" in summary(results[1])["reason"]
    assert f"not ready: {bad}" in summary(results[0])["reason"]
    assert codes(rack.run_hooks("epilog", 502)) == [0, 0, 0]
    assert rack.leftovers() == []


def test_blame_peers_leaves_the_failure_to_the_culprit(make_rack: Any) -> None:
    """With blame_peers = yes only the tray whose daemon never gets READY fails."""
    rack = make_rack(3, deadline_s=5)
    for t in rack.trays:
        t.config.write_text(t.config.read_text().replace("[readiness]\n", "[readiness]\nblame_peers = yes\n"))
    rack.set_faults(f"@{rack.trays[1].address} never_ready")
    results = rack.run_hooks("prolog", 503)
    assert codes(results) == [0, 75, 0]
    assert summary(results[0])["blamed"] == [rack.trays[1].address]
    assert codes(rack.run_hooks("epilog", 503)) == [0, 0, 0]
    assert rack.leftovers() == []


def test_daemon_crash_mid_job_shows_in_status_and_epilog_cleans(make_rack: Any) -> None:
    """A daemon killed mid-job shows as stale in status and as UNAVAILABLE to peers; the epilog cleans up."""
    rack = make_rack(2)
    assert codes(rack.run_hooks("prolog", 504)) == [0, 0]
    t1, t2 = rack.trays
    pid = status(rack, t2)["jobs"][0]["daemon"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: status(rack, t2)["jobs"][0]["daemon"]["state"] != "running", what="daemon seen dead")
    st = status(rack, t2)
    assert "no daemon process" in " ".join(st["stale"])
    wait_for(lambda: domain(rack, t1, 504)["nodes"]["1"]["status"] == "UNAVAILABLE", what="peer UNAVAILABLE")
    assert domain(rack, t1, 504)["status"] != "UP"
    assert codes(rack.run_hooks("epilog", 504)) == [0, 0]
    assert rack.leftovers() == []


def test_nodes_file_mismatch_is_detected(make_rack: Any) -> None:
    """Trays that resolve a name differently get different nodes files: the prolog fails with !M!."""
    rack = make_rack(2, deadline_s=8)
    t1, t2 = rack.trays
    hosts = rack.hosts_file(t2)
    hosts.write_text(hosts.read_text().replace(f"{t1.address} ", "127.0.0.250 ", 1))
    results = rack.run_hooks("prolog", 509)
    assert all(code != 0 for code in codes(results))
    assert any("NODE_MAP_MISMATCH" in summary(r)["reason"] for r in results)
    assert rack.leftovers() == []


def test_stale_daemon_of_previous_job_blocks_until_cleanup(make_rack: Any) -> None:
    """A previous job's daemon left running (epilog lost) refuses the next job until cleanup --force."""
    rack = make_rack(2)
    assert codes(rack.run_hooks("prolog", 505)) == [0, 0]
    # job 1505 gets the same SERVER_PORT as 505; its prolog must not start a second daemon
    results = rack.run_hooks("prolog", 1505)
    assert codes(results) == [69, 69]
    assert all("belongs to job 505" in summary(r)["reason"] for r in results)
    for t in rack.trays:
        # no slurmstepd, no cgroup and no epilog: job 505 may still run, as far as the tray can tell
        kept = rack.imexctl(t, "cleanup")
        assert kept.returncode == 0 and "skipped: job 505 may still run on this node" in kept.stdout
        done = rack.imexctl(t, "cleanup", "--job", "505", "--force")
        assert done.returncode == 0 and "job 505" in done.stdout
    assert rack.leftovers() == []
    assert codes(rack.run_hooks("prolog", 1505)) == [0, 0]
    assert codes(rack.run_hooks("epilog", 1505)) == [0, 0]
    assert rack.leftovers() == []


def test_stray_daemon_of_a_job_that_no_longer_runs_is_cleared_by_the_next_prolog(make_rack: Any) -> None:
    """A daemon whose job directory vanished, of a job with no slurmstepd here: the next prolog tears it down.

    Issue 22: leftovers of a job that no longer runs on the tray clear themselves, without a drain and
    without an admin; the prolog logs what it removed.
    """
    rack = make_rack(1)
    t = rack.trays[0]
    assert codes(rack.run_hooks("prolog", 506)) == [0]
    os.rename(t.root / "run/imexctl/jobs/506", t.root / "run/imexctl/jobs/.moved")
    result = rack.run_hooks("prolog", 507)[0]
    assert result.returncode == 0, summary(result)
    lines = [json.loads(ln) for ln in (t.root / "var/log/imexctl.log").read_text().splitlines()]
    removed = [rec for rec in lines if rec["event"] == "state.removed" and rec.get("job_id") == 507]
    assert removed and "leftovers of job 506" in removed[0]["reason"], lines[-3:]
    assert any("job 506" in action for action in removed[0]["actions"]), removed[0]
    assert codes(rack.run_hooks("epilog", 507)) == [0]
    assert not [x for x in rack.leftovers() if x.startswith("process")]


def test_a_pager_on_a_job_file_blocks_nothing(make_rack: Any) -> None:
    """Root's ``tail -F`` on a job's state.json (a pager left open) is no stray daemon (issue 22).

    The simulated daemon (a '#!python' script, the configured nvidia_imex) is
    found by status and stopped by the epilog; the pager blocks no prolog and
    survives every hook and cleanup.
    """
    rack = make_rack(1)
    t = rack.trays[0]
    assert codes(rack.run_hooks("prolog", 520)) == [0]
    state = t.root / "run/imexctl/jobs/520/state.json"
    pager = subprocess.Popen(["/usr/bin/tail", "-F", str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: str(state).encode() in Path(f"/proc/{pager.pid}/cmdline").read_bytes(), what="tail's argv")
        shown = json.loads(rack.imexctl(t, "status", "--json").stdout)["data"]
        assert [j["job_id"] for j in shown["jobs"]] == [520] and shown["jobs"][0]["daemon"]["pid"] != pager.pid
        assert codes(rack.run_hooks("epilog", 520)) == [0]
        assert codes(rack.run_hooks("prolog", 521)) == [0]
        assert codes(rack.run_hooks("epilog", 521)) == [0]
        assert rack.imexctl(t, "cleanup").returncode == 0
        assert pager.poll() is None
        assert [x for x in rack.leftovers() if not x.startswith(f"process {pager.pid}:")] == []
    finally:
        pager.kill()
        pager.wait()


def test_back_to_back_jobs_on_the_same_trays(make_rack: Any) -> None:
    """Consecutive jobs on the same trays each get a fresh domain on their own port."""
    rack = make_rack(2)
    ports = set()
    for job_id in (510, 511, 512):
        results = rack.run_hooks("prolog", job_id)
        assert codes(results) == [0, 0]
        ports.add(summary(results[0])["port"])
        assert domain(rack, rack.trays[0], job_id)["status"] == "UP"
        assert codes(rack.run_hooks("epilog", job_id)) == [0, 0]
        assert rack.leftovers() == []
    assert len(ports) == 3
