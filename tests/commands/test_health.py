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
from imexctl.platform import kmsg
from imexctl.platform.errors import GpuError
from imexctl.slurm.node import parse_show_node
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost

BOOT = "7e0493b2-61b7-4448-b8c3-88f6a56ee7c9"
ABRUPT = "NVRM: Abrupt nvidia-imex daemon shutdown detected, disabled fabric allocations"


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


def kernel_log(root: Path, *records: tuple[int, str], append: bool = False) -> None:
    """``root``/dev/kmsg in /dev/kmsg's record format (a regular file: many records per read)."""
    text = "".join(f"6,{seq},{seq * 1000},-;{msg}\n SUBSYSTEM=test\n" for seq, msg in records)
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
    host.now += 60  # lock_timeout_s 30 + stop_timeout_s 1 + kill_grace_s 1 (the test settings) + 10 s
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: stale_daemon: IMEX daemon pid")


# ---------------------------------------------------------------- faults and the drain


def test_a_gone_jobs_daemon_drains_with_our_prefix(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """SLURM_NODE_IS_HEALTHY=yes: drained at once (no question first), code first, node named; exit 1; logged."""
    daemon_of(tray, host, 44, set_up=5.0, ended=9.0)
    pid = max(host.procs)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    reason = f"imex-health:stale_daemon gb01: IMEX daemon pid {pid} of job 44, which no longer runs here"
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
        "imex:not_ready gb01: peers gb02 unreachable",  # a hook's
        "NHC: check_fs_mount: /scratch not mounted",  # another health checker's
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
    host.slurm_nodes["gb01"] = {"state": "DOWN+DRAIN", "reason": "imex-health:stock_unit gb01: old"}
    assert run(tray, host, gpu) == 0
    assert host.slurm_nodes["gb01"]["state"] == "DOWN+DRAIN"


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


def test_config_that_does_not_load(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    (tray / "imexctl.conf").write_text("[readiness]\ndeadline_s = soon\n")
    assert run(tray, host, gpu, "--check-only") == 1
    assert capsys.readouterr().out.startswith("unhealthy gb01: config_invalid:")
    assert not (tray / "run").exists()


# ---------------------------------------------------------------- the kernel's line


def test_kernel_line_once_per_occurrence_and_resumed_only_by_an_admin(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """The line since the last check drains; the next check does not see it again (the position is kept), and
    the node stays drained: the kernel refuses fabric allocations until an admin's recovery."""
    kernel_log(tray, (2, "usb 1-1: new device"), (3, ABRUPT), append=True)
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="yes") == 1
    assert host.slurm_nodes["gb01"]["reason"].startswith("imex-health:imex_shutdown gb01: kernel: 'Abrupt")
    assert (tray / "run/imexctl/health.kmsg").read_text() == f"{BOOT} 3\n"
    capsys.readouterr()
    assert run(tray, host, gpu, SLURM_NODE_IS_HEALTHY="no") == 0
    assert "slurm: kept: drained for imex_shutdown: an admin resumes it" in capsys.readouterr().out
    assert host.slurm_nodes["gb01"]["state"] == "IDLE+DRAIN"
    kernel_log(tray, (4, ABRUPT), append=True)  # a second one: seen once more
    assert run(tray, host, gpu, "--check-only") == 1
    assert run(tray, host, gpu, "--check-only") == 0


def test_a_new_boot_reads_its_log_from_the_start(tray: Path, host: FakeHost, gpu: FakeGpu) -> None:
    (tray / "run/imexctl").mkdir(parents=True)
    (tray / "run/imexctl/health.kmsg").write_text("an-earlier-boot 900\n")
    kernel_log(tray, (0, "Linux version"), (1, ABRUPT))
    assert run(tray, host, gpu, "--check-only") == 1


def test_an_unreadable_kernel_log_is_no_fault(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    (tray / "dev/kmsg").unlink()
    assert run(tray, host, gpu, "--check-only") == 0
    assert "note: kernel log not read: No such file or directory" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/kmsg"), reason="needs root: reads the real /dev/kmsg")
def test_the_real_kernel_log_reads_without_blocking() -> None:
    """/dev/kmsg: one record per read, EAGAIN at the end; sequence numbers grow; a position skips what was read."""
    records, last = kmsg.read_after("/dev/kmsg", -1)
    assert records and [s for s, _ in records] == sorted(s for s, _ in records) and last == records[-1][0]
    again, last2 = kmsg.read_after("/dev/kmsg", last)
    assert all(s > last for s, _ in again) and last2 >= last


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
    host.slurm_nodes["gb01"] = {"state": "IDLE+DRAIN", "reason": "imex-health:stale_daemon gb01: \x1b[31mred"}
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "active"}
    run(tray, host, gpu)
    out = capsys.readouterr().out
    assert "slurm: gb01 is IDLE+DRAIN: imex-health:stale_daemon gb01: \\x1b[31mred" in out and "\x1b" not in out


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
    finding = health.Finding("stale_daemon", "é" * 400 + "\n")
    verdict = health.Verdict("gb01", (finding, finding), False, False, ())
    from imexctl.slurm.node import clean_reason

    reason = clean_reason(health.reason_of(verdict))
    assert len(reason) <= 255 and reason.isascii() and reason.startswith("imex-health:stale_daemon gb01: ")


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
