"""imexctl health: only faults of the tray, never a hook in flight; drains and resumes only with its own prefix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from imexctl import cli
from imexctl.commands import health
from imexctl.gpu.fabric import FabricInfo
from imexctl.hooks.state import node_lock
from imexctl.imex import driverlog
from imexctl.platform import kmsg
from imexctl.platform.errors import GpuError
from imexctl.slurm.node import parse_show_node
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost

BOOT = "7e0493b2-61b7-4448-b8c3-88f6a56ee7c9"
#: the driver's record as the kernel keeps it: NV_PRINTF's default prefix (no GPU current), the sentence
ABRUPT = f"NVRM: imexsessionapiDestruct_IMPL: {driverlog.DISABLED}"
RECOVERED = f"NVRM: imexsessionapiDestruct_IMPL: {driverlog.RECOVERY}"
#: PRIO of the driver's records: facility 0 (the kernel's), level 4 (printk's default: nv_printf gives none)
DRIVER = 4


@pytest.fixture
def tray(root: Path, host: FakeHost) -> Path:
    """A tray under ``root``: the kernel's boot id and log, slurmctld knowing gb01 in service."""
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (root / "dev").mkdir()
    kernel_log(root, (0, "Linux version 6.1.0"), (1, "Command line: quiet"))
    write_config(root, {"paths": {"root": str(root)}, "daemon": {"backend": "exec"}, "policy": {"fabric": "nvml"}})
    host.slurm_nodes["gb01"] = {"state": "IDLE"}
    return root


def kernel_log(root: Path, *records: tuple[int, str] | tuple[int, str, int], append: bool = False) -> None:
    """``root``/dev/kmsg in /dev/kmsg's record format (a regular file: many records per read).

    A record is ``(seq, text)`` (PRIO 6: the kernel's facility, level info) or ``(seq, text, PRIO)``.
    """
    lines = [(r[0], r[1], r[2] if len(r) > 2 else 6) for r in records]
    text = "".join(f"{prio},{seq},{seq * 1000},-;{msg}\n SUBSYSTEM=test\n" for seq, msg, prio in lines)
    with open(root / "dev/kmsg", "a" if append else "w") as f:
        f.write(text)


def run(tray: Path, host: FakeHost, gpu: FakeGpu, *args: str, **env: str) -> int:
    return cli.main(
        ["--config", str(tray / "imexctl.conf"), "health", *args],
        env={"SLURMD_NODENAME": "gb01", **env},
        host=host,
        gpu=gpu,
    )


def scontrols(host: FakeHost) -> list[tuple[str, ...]]:
    return [c[1:] for c in host.calls if Path(c[0]).name == "scontrol"]


def daemon_of(tray: Path, host: FakeHost, job_id: int, **marks: float) -> None:
    """A job's directory, state (with ``marks``) and running daemon, as a prolog leaves them."""
    jd = tray / f"run/imexctl/jobs/{job_id}"
    jd.mkdir(parents=True)
    state = {"job_id": job_id, "node": "gb01", "uid": 1000, "gid": 1000, "user": "u", "nodes": ["gb01", "gb02"]}
    state |= {"addresses": ["10.0.0.1", "10.0.0.2"], "port": 61000 + job_id, "backend": "exec"}
    state |= {"channel_minor": None, "channel_path": "", "created": 0.0, "cmd_port": 62000 + job_id, **marks}
    (jd / "state.json").write_text(json.dumps(state))
    host.spawn_detached(["/usr/bin/nvidia-imex", "-c", str(jd / "config.cfg")], log_path=Path("/dev/null"))


# ---------------------------------------------------------------- healthy trays


def test_idle_tray_is_healthy_without_asking_slurmctld(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Idle, no daemon: exit 0; with SLURM_NODE_IS_HEALTHY=yes slurmctld is not asked, nothing is logged."""
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "healthy gb01: idle, no IMEX daemon"
    assert "slurm: none: healthy, and in service" in out
    assert scontrols(host) == []
    assert (
        not (tray / "var/log/imexctl.log").exists() or "health.done" not in (tray / "var/log/imexctl.log").read_text()
    )


def test_without_the_variable_slurmctld_is_asked_once(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Slurm before 26.05.3 (or without health_check_report), cron: one bounded 'scontrol show node'."""
    assert run(tray, host, gpu) == 0
    assert scontrols(host) == [("show", "node", "gb01")]
    assert "slurm: none: in service" in capsys.readouterr().out


def test_a_running_jobs_domain_is_healthy(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """A set-up domain whose job has no step yet (PrologFlags=Alloc) counts as running: healthy."""
    daemon_of(tray, host, 42, set_up=5.0)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    assert capsys.readouterr().out.startswith("healthy gb01: the jobs' domains run")


@pytest.mark.parametrize("marks", [{}, {"set_up": 5.0, "ended": 9.0}], ids=["prolog-setting-up", "epilog-begun"])
def test_a_hook_in_flight_is_healthy_and_never_drained(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any, marks: dict[str, float]
) -> None:
    """While a hook holds the node lock its half-written state is no fault: exit 0, no drain, no wait.
    The same state without the lock (the hook died there) is a stale daemon."""
    daemon_of(tray, host, 43, **marks)
    with node_lock(tray / "run/imexctl/lock", host, 1):
        for env in ({}, {"SLURM_NODE_IS_HEALTHY": "yes"}, {"SLURM_NODE_IS_HEALTHY": "no"}):
            assert run(tray, host, gpu, **env) == 0
            assert capsys.readouterr().out.startswith("healthy gb01: a prolog or epilog is in progress")
    assert host.slept == [] and host.slurm_nodes["gb01"] == {"state": "IDLE"}
    assert [c for c in scontrols(host) if c[0] == "update"] == []
    assert run(tray, host, gpu) == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: stale_daemon: IMEX daemon pid")


def test_an_epilog_that_marked_its_job_before_taking_the_lock_is_in_flight(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """The epilog marks the job ended *before* it takes the node lock (so one that times out on the lock still
    leaves its job to cleanup): for that moment, or while another hook holds the lock, the job looks ended,
    its daemon alive, the lock free.  Seen in the 26.05 lab as a drain of a healthy tray.  Until an epilog's
    longest wait has passed since the mark it is in flight; after that, a stale daemon."""
    daemon_of(tray, host, 50, set_up=5.0, ended=host.time() - 3)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    assert capsys.readouterr().out.startswith("healthy gb01: a prolog or epilog is in progress")
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"}
    host.now += 80  # an older epilog's mark (no deadline in it): process_wait_s 20 + lock 30 + stop 15 + kill 5 + 10 s
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: stale_daemon: IMEX daemon pid")


# ---------------------------------------------------------------- faults and the drain


def test_a_gone_jobs_daemon_drains_with_our_prefix(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """SLURM_NODE_IS_HEALTHY=yes: drained at once (no question first), code first, node named; exit 1; logged."""
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    pid = max(host.procs)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    reason = f"imexh:stale_daemon gb01: IMEX daemon pid {pid} of job 44, which no longer runs here"
    assert host.slurm_nodes["gb01"] == {"state": "IDLE+DRAIN", "reason": reason}
    assert scontrols(host) == [("update", "NodeName=gb01", "State=DRAIN", f"Reason={reason}")]
    out = capsys.readouterr().out
    assert "fix stale_daemon: imexctl cleanup" in out and f"slurm: drained: {reason}" in out
    if os.geteuid() == 0:  # a command writes [paths] log_file only as root (logsetup.open_command_sink)
        logged = [json.loads(line) for line in (tray / "var/log/imexctl.log").read_text().splitlines()]
        assert [(e["event"], e["ok"], e["slurm"], e["node"]) for e in logged] == [
            ("health.done", False, "drained", "gb01")
        ]


def test_cleanup_brings_it_back(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Once the fault is gone, health resumes the node it drained (slurmd says no: it asks whose reason)."""
    daemon_of(tray, host, 45, set_up=5.0, ended=9.0)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    for p in host.procs.values():
        p.alive = False  # imexctl cleanup
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"}
    assert scontrols(host)[-2:] == [("show", "node", "gb01"), ("update", "NodeName=gb01", "State=RESUME")]
    assert "slurm: resumed: the fault (stale_daemon) is gone" in capsys.readouterr().out


@pytest.mark.parametrize(
    "reason",
    [
        "imex:not_ready gb01 job 7: peers gb02 unreachable",  # a hook's
        "NHC: check_fs_mount: /scratch not mounted",  # another health checker's
        "NHC: imexn:stale_daemon gb01: IMEX daemon pid 7 of job 9, which no longer runs here",  # NHC's, of our check
        "bad DIMM; noimexh:stale_daemon gb01: not a prefix inside a word",
        "bad DIMM, ticket 4711",  # an admin's
        "imex-healthy? no: an admin who chose a close name",
    ],
)
def test_another_reason_is_never_resumed_nor_replaced(
    tray: Path, host: FakeHost, gpu: FakeGpu, reason: str, capsys: Any
) -> None:
    host.slurm_nodes["gb01"] = {"state": "IDLE+DRAIN", "reason": reason}
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert host.slurm_nodes["gb01"] == {"state": "IDLE+DRAIN", "reason": reason}
    daemon_of(tray, host, 46, set_up=5.0, ended=9.0)
    assert run(tray, host, gpu) == 1  # a fault as well: the reason is kept
    assert host.slurm_nodes["gb01"] == {"state": "IDLE+DRAIN", "reason": reason}
    assert [c for c in scontrols(host) if c[0] == "update"] == []
    assert "slurm: kept: already out of service: reason kept" in capsys.readouterr().out


def test_a_down_node_is_left_to_slurmctld(tray: Path, host: FakeHost, gpu: FakeGpu) -> None:
    host.slurm_nodes["gb01"] = {"state": "DOWN+DRAIN", "reason": "imexh:stock_unit gb01: old"}
    assert run(tray, host, gpu) == 0
    assert host.slurm_nodes["gb01"]["state"] == "DOWN+DRAIN"


@pytest.mark.parametrize(
    "tagged",
    [
        pytest.param("[ticket 4711] {}", id="tag-before"),
        pytest.param("{} [RO:reboot-pending]", id="tag-after"),
        pytest.param("RO: reboot; {} (seen 2x)", id="tags-both-sides"),
        pytest.param("{legacy} [RO:reboot-pending]", id="older-version-tag-after"),
    ],
)
def test_its_own_drain_is_known_by_its_prefix_with_a_tag_added(
    tray: Path, host: FakeHost, gpu: FakeGpu, tagged: str, capsys: Any
) -> None:
    """Another tool added a tag before or after health's reason (NVIDIA's Remediation Orchestrator, a ticket
    system), or an older imexctl drained the tray with ``imex-health:``: while the fault lasts the drain is
    health's and kept as it is, tag and all; once the fault is gone health resumes the tray."""
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    ours = host.slurm_nodes["gb01"]["reason"]
    assert ours.startswith("imexh:stale_daemon gb01: "), ours
    reason = tagged.format(ours, legacy=ours.replace("imexh:", "imex-health:", 1))
    host.slurm_nodes["gb01"]["reason"] = reason
    capsys.readouterr()
    assert run(tray, host, gpu) == 1  # slurmd did not say: slurmctld is asked, and the reason is health's
    assert host.slurm_nodes["gb01"] == {"state": "IDLE+DRAIN", "reason": reason}
    assert "slurm: kept: already out of service: reason kept" in capsys.readouterr().out
    for p in host.procs.values():
        p.alive = False  # imexctl cleanup
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"}
    assert "slurm: resumed: the fault (stale_daemon) is gone" in capsys.readouterr().out


def test_its_own_drain_for_other_findings_is_updated(tray: Path, host: FakeHost, gpu: FakeGpu) -> None:
    """A tagged drain of health's for a fault that is gone, another fault found now: the reason is replaced with
    the one for what is found now (the tag was about the old fault)."""
    host.slurm_nodes["gb01"] = {"state": "IDLE+DRAIN", "reason": "[ticket 7] imexh:stale_daemon gb01: old"}
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "active"}
    assert run(tray, host, gpu) == 1
    assert host.slurm_nodes["gb01"]["reason"].startswith("imexh:stock_unit gb01: nvidia-imex.service is active")


def test_check_only_never_asks_or_changes_slurm(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    daemon_of(tray, host, 47, set_up=5.0, ended=9.0)
    assert run(tray, host, gpu, "--check-only") == 1
    assert scontrols(host) == [] and host.slurm_nodes["gb01"] == {"state": "IDLE"}
    assert "slurm:" not in capsys.readouterr().out


def test_stock_unit_running_is_a_fault(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "active"}
    assert run(tray, host, gpu, "--check-only") == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: stock_unit: nvidia-imex.service is active")
    host.units["nvidia-imex.service"] = {"LoadState": "masked", "ActiveState": "inactive"}
    assert run(tray, host, gpu, "--check-only") == 0


def test_fabric(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """NVML failing or a GPU's fabric UNHEALTHY is a fault; a registration still pending is not."""
    gpu.infos = [FabricInfo(i, b"\x11" * 16, 7, 2 if i == 1 else 3, 0) for i in range(4)]  # GPU 1: IN_PROGRESS
    assert run(tray, host, gpu, "--check-only") == 0
    gpu.infos[1] = FabricInfo(1, b"\x11" * 16, 7, 3, 0, health_mask=0, health_summary=2)  # UNHEALTHY
    assert run(tray, host, gpu, "--check-only") == 1
    assert "gpu_failed: NVLink fabric: GPU 1: state COMPLETED" in capsys.readouterr().out
    gpu.error = GpuError("NVML init failed: NVML_ERROR_DRIVER_NOT_LOADED")
    assert run(tray, host, gpu, "--check-only") == 1
    assert "gpu_failed: NVML: NVML init failed" in capsys.readouterr().out


def test_limited_capacity_drains_only_when_the_policy_refuses_it(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """LIMITED_CAPACITY (NVLink bandwidth degraded) under the default ``fabric_limited = warn``: the prolog lets
    it pass, so health neither fails nor drains the tray; with ``refuse`` it is ``gpu_failed``, drained."""
    # GPU 2: LIMITED_CAPACITY
    gpu.infos = [
        FabricInfo(i, b"\x11" * 16, 7, 3, 0, health_mask=0, health_summary=3 if i == 2 else 1) for i in range(4)
    ]
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    assert capsys.readouterr().out.startswith("healthy gb01: idle, no IMEX daemon")
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"} and scontrols(host) == []
    policy = {"fabric": "nvml", "fabric_limited": "refuse"}
    write_config(tray, {"paths": {"root": str(tray)}, "daemon": {"backend": "exec"}, "policy": policy})
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert host.slurm_nodes["gb01"]["reason"].startswith("imexh:gpu_failed gb01: NVLink fabric: GPU 2: ")


def test_health_never_waits_for_the_node_lock(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Another process (a hook) holds the node lock: health answers at once, 'in progress', and never waits.

    The holder keeps the lock until this test ends it (at most 30 s): a health that waited would hang here
    until then and then judge the tray idle, so this test fails by its own limit or by its output."""
    import subprocess
    import sys

    lock = tray / "run/imexctl/lock"
    lock.parent.mkdir(parents=True)
    hold = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(30)\n"
    )
    holder = subprocess.Popen([sys.executable, "-I", "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
        assert capsys.readouterr().out.startswith("healthy gb01: a prolog or epilog is in progress")
        assert holder.poll() is None  # still holding: health answered while the lock was taken
    finally:
        holder.kill()
        holder.wait()
    assert host.slept == []


def test_config_that_does_not_load(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    (tray / "imexctl.conf").write_text("[readiness]\ndeadline_s = soon\n")
    assert run(tray, host, gpu, "--check-only") == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: config_invalid:")
    assert not (tray / "run").exists()


# ---------------------------------------------------------------- the kernel's line


def cursor(tray: Path) -> str:
    """What health keeps in ``<run_dir>/health.kmsg``."""
    return (tray / "run/imexctl/health.kmsg").read_text()


def test_kernel_line_drains_once_and_only_an_admin_resumes(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """The driver's line since the last check drains, naming the line, what the driver does and who resumes; once
    Slurm holds the drain the evidence is let go (the position is kept), and the node stays drained for an admin."""
    kernel_log(tray, (2, "usb 1-1: new device"), (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"unhealthy gb01: imex_shutdown: kernel: '{driverlog.DISABLED}' (1x, last kmsg seq 3, 0 s after boot):"
        " the driver refuses fabric allocations on this tray until the next nvidia-imex starts"
    )
    assert out[1] == (
        "  fix imex_shutdown: an admin resumes the tray once the job that lost its daemon has ended on every tray"
        " of its domain (scontrol update nodename=<node> state=resume; NHC: imexctl health --acknowledge)"
        " (docs/troubleshooting.md#imex_shutdown)"
    )
    assert host.slurm_nodes["gb01"]["reason"].startswith(
        f"imexh:imex_shutdown gb01: kernel: '{driverlog.DISABLED}' (1x, "
    )
    assert cursor(tray) == f"{BOOT} 3\n"  # Slurm holds it: nothing pending
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert "slurm: kept: drained for imex_shutdown: an admin resumes it" in capsys.readouterr().out
    assert host.slurm_nodes["gb01"]["state"] == "IDLE+DRAIN"


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(f"NVRM: GPU3 imexsessionapiDestruct_IMPL: {driverlog.DISABLED}", id="gpu-current"),
        pytest.param(ABRUPT, id="no-gpu"),
        pytest.param(ABRUPT + "!", id="570.86-to-570.144"),
    ],
)
def test_the_drivers_own_line_counts(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any, record: str) -> None:
    """Every shape the driver prints (NV_PRINTF's default prefix with or without the current GPU, the '!' of
    570.86.15 to 570.144 and 575.51), with the kernel's facility."""
    kernel_log(tray, (7, record, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1
    assert capsys.readouterr().out.startswith(f"unhealthy gb01: imex_shutdown: kernel: '{driverlog.DISABLED}' (1x,")


@pytest.mark.parametrize(
    "record",
    [
        # written to /dev/kmsg by user space: the kernel gives it LOG_USER (PRIO 11: facility 1, level 3)
        pytest.param((5, ABRUPT, 11), id="user-space-record"),
        # a user's mount option echoed by the kernel (unshare -rm; mount -t tmpfs -o '...' none /x)
        pytest.param((5, "tmpfs: Unknown parameter 'Abrupt nvidia-imex daemon shutdown detected'", 3), id="tmpfs"),
        pytest.param((5, f"tmpfs: Unknown parameter '{ABRUPT}'", 3), id="tmpfs-whole-line"),
        # a command named 'NVRM: Abrupt n' (15 bytes) that segfaults in a library the user named after the line
        pytest.param(
            (5, f"NVRM: Abrupt n[4242]: segfault at 0 ip 0 sp 0 error 4 in {driverlog.DISABLED}[7f00+1000]", 6),
            id="comm-prefixed",
        ),
        # the sentence without the driver's prefix, or with more after it: no shape the driver prints
        pytest.param((5, f"NVRM: {driverlog.DISABLED}", DRIVER), id="no-function"),
        pytest.param((5, f"{ABRUPT}' ignored", DRIVER), id="more-after"),
        pytest.param((5, f"NVRM: GPU03 imexsessionapiDestruct_IMPL: {driverlog.DISABLED}", DRIVER), id="gpu-0-pad"),
        pytest.param((5, f"NVRM: GPUx imexsessionapiDestruct_IMPL: {driverlog.DISABLED}", DRIVER), id="gpu-not-num"),
        pytest.param((5, f"NVRM: imexsessionapiDestruct: {driverlog.DISABLED}", DRIVER), id="other-function"),
    ],
)
def test_only_the_drivers_own_record_counts(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any, record: tuple[int, str, int]
) -> None:
    """A record that user space wrote, or a kernel record that only holds the sentence, is not the driver's:
    healthy, nothing drained (issue 41: any local user could drain a tray with one mount)."""
    kernel_log(tray, record, append=True)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    assert capsys.readouterr().out.startswith("healthy gb01: idle, no IMEX daemon")
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"} and scontrols(host) == []


def test_robust_channel_recovery_alone_drains_nothing(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """The driver's other line (the epilog stopped a daemon while a job's stragglers held imported memory): the
    driver stopped them, the tray is fine; a note, no finding, no drain."""
    kernel_log(tray, (3, RECOVERED, DRIVER), (4, RECOVERED + "!", DRIVER), append=True)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    out = capsys.readouterr().out
    assert out.startswith("healthy gb01: idle, no IMEX daemon")
    assert (
        f"  note: kernel: '{driverlog.RECOVERY}' (2x, last kmsg seq 4): the driver stopped the processes here that"
        " still held memory imported through the daemon (a job's stragglers); no fault of the tray\n"
    ) in out
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"} and scontrols(host) == []


def test_check_only_keeps_the_evidence(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Under NHC (--check-only) nothing hands the evidence to Slurm: every run reports it, counted once per line."""
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1
    assert run(tray, host, gpu, "--check-only") == 1
    kernel_log(tray, (4, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("(")[1].split(",")[0] for line in lines if line.startswith("unhealthy")] == ["1x", "1x", "2x"]
    assert cursor(tray) == f"{BOOT} 4\nimex_shutdown 2 {BOOT} 4 4000\n"
    assert scontrols(host) == []


def test_a_drain_that_fails_keeps_the_evidence(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """scontrol update fails: the evidence stays pending, and the next run drains for it."""
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    known = host.slurm_nodes.pop("gb01")  # slurmctld refuses: "Invalid node name specified"
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert "slurm: failed: drain: scontrol update: exit 1" in capsys.readouterr().out
    assert cursor(tray) == f"{BOOT} 3\nimex_shutdown 1 {BOOT} 3 3000\n"
    host.slurm_nodes["gb01"] = known
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert host.slurm_nodes["gb01"]["reason"].startswith("imexh:imex_shutdown gb01: kernel: ")
    assert cursor(tray) == f"{BOOT} 3\n"


def test_out_of_service_for_another_reason_keeps_the_evidence_until_slurm_holds_it(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """An admin's drain stands and is not replaced, but it is not ours: slurmctld is asked (whose reason?) and the
    evidence stays pending; once the admin resumes the node, the next run drains for it."""
    host.slurm_nodes["gb01"] = {"state": "IDLE+DRAIN", "reason": "bad DIMM, ticket 4711"}
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    for _ in range(2):
        assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 1
        assert "slurm: kept: already out of service: reason kept" in capsys.readouterr().out
    assert host.slurm_nodes["gb01"] == {"state": "IDLE+DRAIN", "reason": "bad DIMM, ticket 4711"}
    assert scontrols(host) == [("show", "node", "gb01")] * 2
    host.slurm_nodes["gb01"] = {"state": "IDLE"}  # the admin's resume
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert host.slurm_nodes["gb01"]["reason"].startswith("imexh:imex_shutdown gb01: ")
    assert cursor(tray) == f"{BOOT} 3\n"


def test_the_evidence_leads_the_reason_so_no_auto_resume_clears_it(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """With a stale daemon beside it, the drain's reason names imex_shutdown first: once cleanup removed the
    daemon, health does not resume the node (it would for stale_daemon alone)."""
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    reason = host.slurm_nodes["gb01"]["reason"]
    assert reason.startswith("imexh:imex_shutdown gb01: ") and reason.endswith("(+1 more)"), reason
    for p in host.procs.values():
        p.alive = False  # imexctl cleanup
    capsys.readouterr()
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert "slurm: kept: drained for imex_shutdown: an admin resumes it" in capsys.readouterr().out
    assert host.slurm_nodes["gb01"]["state"] == "IDLE+DRAIN"


def test_acknowledge_lets_the_evidence_go(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """The admin's explicit action under NHC: it prints what it let go, logs it, never touches Slurm; after it a
    check is clean (NHC's next run resumes the node by its own rule)."""
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1
    capsys.readouterr()
    assert run(tray, host, gpu, "--acknowledge") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "healthy gb01: idle, no IMEX daemon"
    assert out[1] == (
        f"acknowledged gb01: imex_shutdown: kernel: '{driverlog.DISABLED}' (1x, last kmsg seq 3, 0 s after boot):"
        " the driver refuses fabric allocations on this tray until the next nvidia-imex starts"
    )
    assert cursor(tray) == f"{BOOT} 3\n" and scontrols(host) == []
    if os.geteuid() == 0:  # a command writes [paths] log_file only as root
        logged = [json.loads(line) for line in (tray / "var/log/imexctl.log").read_text().splitlines()]
        acked = [e for e in logged if e["event"] == "health.acknowledged"]
        assert len(acked) == 1 and acked[0]["findings"] == [f"imex_shutdown: {out[1].split(': ', 2)[2]}"], acked
    assert run(tray, host, gpu, "--check-only") == 0
    assert run(tray, host, gpu, "--acknowledge") == 0
    assert "note: nothing to acknowledge: no kernel evidence is pending" in capsys.readouterr().out
    kernel_log(tray, (4, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--acknowledge", "--json") == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["findings"] == [] and [f["code"] for f in data["acknowledged"]] == ["imex_shutdown"]
    assert data["acknowledged"][0]["resume"] == "admin" and data["slurm"] is None


def test_acknowledge_needs_root(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.euid_value = 1000
    assert run(tray, host, gpu, "--acknowledge") == 77
    assert "--acknowledge keeps its record in root's run directory: run as root" in capsys.readouterr().err


def test_the_ring_wrapping_keeps_a_pending_finding(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """The kernel's ring buffer overwrote the driver's line: the evidence kept in health.kmsg is still reported."""
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1
    kernel_log(tray, (500, "eth0: link up"), (501, "usb 1-1: new device"))  # records 0 to 499 are gone
    capsys.readouterr()
    assert run(tray, host, gpu, "--check-only") == 1
    assert capsys.readouterr().out.startswith(
        f"unhealthy gb01: imex_shutdown: kernel: '{driverlog.DISABLED}' (1x, last kmsg seq 3, 0 s after boot)"
    )
    assert cursor(tray) == f"{BOOT} 501\nimex_shutdown 1 {BOOT} 3 3000\n"


def test_a_new_boot_reads_its_log_from_the_start_and_keeps_what_is_pending(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    (tray / "run/imexctl").mkdir(parents=True)
    (tray / "run/imexctl/health.kmsg").write_text("an-earlier-boot 900\n")
    kernel_log(tray, (0, "Linux version"), (1, ABRUPT, DRIVER))
    assert run(tray, host, gpu, "--check-only") == 1
    (tray / "run/imexctl/health.kmsg").write_text("an-earlier-boot 900\nimex_shutdown 2 an-earlier-boot 880 9000000\n")
    kernel_log(tray, (0, "Linux version"))
    capsys.readouterr()
    assert run(tray, host, gpu, "--check-only") == 1
    assert f"'{driverlog.DISABLED}' (2x, last kmsg seq 880, an earlier boot)" in capsys.readouterr().out


def test_a_pending_line_that_cannot_be_parsed_stays_pending(tray: Path, host: FakeHost, gpu: FakeGpu) -> None:
    (tray / "run/imexctl").mkdir(parents=True)
    (tray / "run/imexctl/health.kmsg").write_text(f"{BOOT} 1\nimex_shutdown x\n")
    assert run(tray, host, gpu, "--check-only") == 1


def test_the_position_file_is_never_followed(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """A symlink at health.kmsg is not read through (a note says so) and is replaced, its target left alone."""
    (tray / "run/imexctl").mkdir(parents=True)
    target = tray / "elsewhere"
    target.write_text(f"{BOOT} 999\n")
    (tray / "run/imexctl/health.kmsg").symlink_to(target)
    kernel_log(tray, (3, ABRUPT, DRIVER), append=True)
    assert run(tray, host, gpu, "--check-only") == 1  # read from the start, not from the symlink's 999
    assert "note: kernel log position not read from" in capsys.readouterr().out
    assert target.read_text() == f"{BOOT} 999\n" and not (tray / "run/imexctl/health.kmsg").is_symlink()


def test_an_unreadable_kernel_log_is_no_fault(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    (tray / "dev/kmsg").unlink()
    assert run(tray, host, gpu, "--check-only") == 0
    assert "note: kernel log not read: No such file or directory" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/kmsg"), reason="needs root: reads the real /dev/kmsg")
def test_the_real_kernel_log_reads_without_blocking() -> None:
    """/dev/kmsg: one record per read, EAGAIN at the end; sequence numbers grow; a position skips what was read;
    the kernel's own records have facility 0 (the first of a boot: 'Linux version')."""
    records, last = kmsg.read_after("/dev/kmsg", -1)
    assert records and [r.seq for r in records] == sorted(r.seq for r in records) and last == records[-1].seq
    assert any(r.facility == kmsg.KERNEL for r in records)
    again, last2 = kmsg.read_after("/dev/kmsg", last)
    assert all(r.seq > last for r in again) and last2 >= last


def test_the_docs_say_what_the_driver_does() -> None:
    """The facts are in imex/driverlog.py; each page that explains imex_shutdown says them in the same words."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    design = docs.joinpath("design.md").read_text()
    assert driverlog.DISABLED in design and driverlog.RECOVERY in design and driverlog.FUNCTION in design
    assert "imex-abrupt`" not in design  # one source row: imex-abrupt-shutdown
    for page in ("operations.md", "troubleshooting.md", "security.md"):
        text = " ".join(docs.joinpath(page).read_text().split())
        assert driverlog.RESUME in text, page
        assert "until a daemon starts again" not in text and "until an admin's recovery" not in text, page
    nhc = " ".join(
        line.lstrip("# ") for line in (docs.parent / "pkg/nhc/imexctl.nhc").read_text().splitlines() if line[:1] == "#"
    )
    assert driverlog.RESUME in nhc and "imexctl health --acknowledge" in nhc


# ---------------------------------------------------------------- output, Slurm's text


def test_json_envelope(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    daemon_of(tray, host, 48, set_up=5.0, ended=9.0)
    assert run(tray, host, gpu, "--json", SLURM_NODE_IS_HEALTHY="yes") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and out["exit_code"] == 1 and out["errors"][0]["code"] == "tray_unhealthy"
    assert out["data"]["findings"][0]["code"] == "stale_daemon" and out["data"]["findings"][0]["resume"] == "auto"
    assert out["data"]["slurm"]["action"] == "drained" and out["data"]["slurm"]["asked"] is False
    assert out["data"]["idle"] is False and out["data"]["in_progress"] is False


def test_a_reason_read_back_is_printed_escaped(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.slurm_nodes["gb01"] = {"state": "IDLE+DRAIN", "reason": "imexh:stale_daemon gb01: \x1b[31mred"}
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "active"}
    run(tray, host, gpu)
    out = capsys.readouterr().out
    assert "slurm: gb01 is IDLE+DRAIN: imexh:stale_daemon gb01: \\x1b[31mred" in out and "\x1b" not in out


def test_show_node_is_read_as_fields() -> None:
    """A reason or comment holding 'State=' or 'Reason=' text changes neither field; multi-line reasons keep
    their first line; the [user@time] stamp is not part of the reason."""
    text = (
        "NodeName=gb01 Arch=x86_64 CoresPerSocket=1 \n"
        "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
        "   Reason=imex-health:stock_unit gb01: x State=IDLE [root@2026-12-02T11:14:31]\n"
        "          second line\n"
        "   Comment=\n"
        "   Reason=imex-health:forged\n"
        "\n"
        "NodeName=gb010 Arch=x86_64 CoresPerSocket=1 \n"
        "   State=IDLE ThreadsPerCore=1\n"
    )
    view = parse_show_node(text, "gb01")
    assert view is not None and view.state == ("IDLE", "DRAIN") and view.drained
    assert view.reason == "imex-health:stock_unit gb01: x State=IDLE"
    other = parse_show_node(text, "gb010")
    assert other is not None and other.state == ("IDLE",) and other.reason == ""
    assert parse_show_node(text, "gb") is None


def test_reason_is_capped_and_ascii() -> None:
    finding = health.Finding("stale_daemon", "é" + "x" * 400 + "\n")
    verdict = health.Verdict("gb01", (finding, finding), False, False, ())
    from imexctl.slurm.node import clean_reason

    reason = clean_reason(health.reason_of(verdict))
    assert len(reason) <= 255 and reason.isascii() and reason.startswith("imexh:stale_daemon gb01: ")
    assert reason.endswith("... (+1 more)"), reason


def test_not_root_judges_no_job_and_touches_nothing(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.euid_value = 1000
    assert run(tray, host, gpu) == 0
    assert "note: jobs and kernel log not judged as uid 1000: run imexctl health as root" in capsys.readouterr().out
    assert scontrols(host) == [] and not (tray / "run").exists()


def test_scontrol_gets_the_callers_slurm_conf(tray: Path, host: FakeHost, gpu: FakeGpu) -> None:
    """slurmd gives HealthCheckProgram no SLURM_CONF (scontrol then finds its own); an admin's or a wrapper's
    SLURM_CONF reaches every scontrol run."""
    daemon_of(tray, host, 49, set_up=5.0, ended=9.0)
    run(tray, host, gpu, SLURM_CONF="/etc/slurm-lab/slurm.conf")
    asked = [(argv[1], env) for argv, env in host.envs if Path(argv[0]).name == "scontrol"]
    assert asked == [
        ("show", {"SLURM_CONF": "/etc/slurm-lab/slurm.conf"}),
        ("update", {"SLURM_CONF": "/etc/slurm-lab/slurm.conf"}),
    ]
    host.envs.clear()
    run(tray, host, gpu)
    assert [argv for argv, _ in host.envs if Path(argv[0]).name == "scontrol"] == []


# ---------------------------------------------------------------- one liveness rule for a stale daemon (issue 41)


@pytest.mark.parametrize("backend", ["exec", "systemd"])
def test_a_gone_jobs_daemon_that_proc_misses_but_its_backend_runs_is_stale(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any, backend: str
) -> None:
    """Job 44 has ended (its epilog's deadline is long past) and its daemon's program moved under it (a driver
    branch's symlink flipped): /proc no longer ties the daemon to [commands] nvidia_imex, but its backend (the
    exec backend's pid file, the systemd unit) says it runs.  By the one liveness rule that is a stale daemon:
    the tray is drained naming the job and what the backend knows of it."""
    write_config(tray, {"paths": {"root": str(tray)}, "daemon": {"backend": backend}, "policy": {"fabric": "nvml"}})
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    jd = tray / "run/imexctl/jobs/44"
    state = json.loads((jd / "state.json").read_text())
    (jd / "state.json").write_text(json.dumps({**state, "backend": backend}))
    proc = host.procs[max(host.procs)]
    if backend == "exec":
        (jd / "daemon.pid").write_text(f"{proc.info.pid} {proc.info.create_time!r}\n")
    else:
        running = {"ActiveState": "active", "SubState": "running", "pid": str(proc.info.pid)}
        host.units["imexctl-imex@44.service"] = running
    proc.info = proc.info._replace(exe="/usr/lib/nvidia/580/nvidia-imex")
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    first = capsys.readouterr().out.splitlines()[0]
    unit = "unit imexctl-imex@44.service, " if backend == "systemd" else ""
    assert first == (
        f"unhealthy gb01: stale_daemon: IMEX daemon ({unit}pid {proc.info.pid}: its {backend} backend says it runs, "
        "/proc does not show it as [commands] nvidia_imex) of job 44, which no longer runs here"
    ), first
    reason = host.slurm_nodes["gb01"]["reason"]
    assert reason.startswith("imexh:stale_daemon gb01: IMEX daemon (") and "of job 44" in reason


def test_a_gone_jobs_daemon_that_is_gone_by_its_backend_too_is_no_fault(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """Control: job 44 ended and its recorded daemon has exited: nothing runs by either look, the tray is healthy
    (the job's directory is cleanup's, not a drain's)."""
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    proc = host.procs[max(host.procs)]
    (tray / "run/imexctl/jobs/44/daemon.pid").write_text(f"{proc.info.pid} {proc.info.create_time!r}\n")
    proc.alive = False
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 0
    assert capsys.readouterr().out.startswith("healthy gb01")
    assert host.slurm_nodes["gb01"] == {"state": "IDLE"}
