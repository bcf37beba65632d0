"""imexctl doctor: every check on a fake tray (``/proc``, ``/etc/slurm``, binaries under a root) and fakes."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl import cli
from imexctl.config import settings
from imexctl.doctor import framework as doctor
from imexctl.doctor import run as doctor_run
from imexctl.doctor.host import GUARDED, JOBS_SCOPE
from imexctl.gpu.fabric import FabricInfo
from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import GpuError
from tests.support.fakes import FakeGpu, FakeHost

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data" / "doctor"
DRIVER_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 04:02:25 UTC 2025\nGCC version:  gcc version 13.3.0\n"
)
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _listen(port: int) -> str:
    return f"   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"


@pytest.fixture
def tray(root: Path, host: FakeHost) -> Path:
    """A tray under ``root``: the good /etc/slurm, imexctl's hooks and binaries, the driver's /proc files."""
    shutil.copytree(DATA / "etc", root / "etc", symlinks=True)
    hooks = root / "usr/share/imexctl/hooks"
    hooks.mkdir(parents=True)
    shutil.copy2(REPO / "hooks/epilog", hooks / "epilog")
    for exe in ("opt/imexctl/bin/imexctl", "usr/bin/nvidia-imex", "usr/bin/nvidia-imex-ctl"):
        (root / exe).parent.mkdir(parents=True, exist_ok=True)
        (root / exe).write_text("#!/bin/sh\nexit 0\n")
        (root / exe).chmod(0o755)
    nv = root / "proc/driver/nvidia"
    nv.mkdir(parents=True)
    (nv / "params").write_text("ResmanDebugLevel: 4294967295\nImexChannelCount: 2048\n")
    (nv / "version").write_text(DRIVER_VERSION)
    ipv4 = root / "proc/sys/net/ipv4"
    ipv4.mkdir(parents=True)
    (ipv4 / "ip_local_port_range").write_text("32768\t60999\n")
    (ipv4 / "ip_local_reserved_ports").write_text("\n")
    (root / "proc/net").mkdir()
    (root / "proc/net/tcp").write_text(TCP_HEADER + _listen(22))
    (root / "proc/net/tcp6").write_text(TCP_HEADER)
    host.unit_exec = f"{root}/usr/bin/nvidia-imex -c {root}/run/imexctl/jobs/{{job}}/config.cfg"
    # the port guard (docs/install.md): cgroup v2, and the rule on the logins' slice and the jobs' scope
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for unit in (GUARDED, JOBS_SCOPE):
        host.units[unit] = {"LoadState": "loaded"}
        host.unit_lists[unit] = {"SocketBindDeny": ["tcp61000-62999"]}
    return root


@pytest.fixture
def make_rt(tray: Path, host: FakeHost, gpu: FakeGpu, make_settings: Callable[..., settings.Settings]) -> Any:
    """A Runtime for the tray: systemd backend, the tray's binaries; keyword sections override."""

    def make(**sections: dict[str, Any]) -> Runtime:
        base: dict[str, dict[str, Any]] = {
            # the shipped defaults (conftest's test settings shorten them): the timeout checks add them up
            "daemon": {"backend": "systemd", "kill_grace_s": 5, "stop_timeout_s": 15},
            "readiness": {"deadline_s": 60},
            "commands": {
                "nvidia_imex": f"{tray}/usr/bin/nvidia-imex",
                "nvidia_imex_ctl": f"{tray}/usr/bin/nvidia-imex-ctl",
            },
        }
        for name, kv in sections.items():
            base.setdefault(name, {}).update(kv)
        return Runtime(host, gpu, make_settings(**base), structlog.get_logger())

    return make


def _checks(rt: Runtime, env: dict[str, str] | None = None, **kw: Any) -> dict[str, doctor.Check]:
    ctx = doctor.Context(rt, env or {}, "gb01", **kw)
    return {c.name: c for c in doctor_run.run(ctx)}


def _statuses(checks: dict[str, doctor.Check], prefix: str = "") -> dict[str, str]:
    return {name: c.status for name, c in checks.items() if name.startswith(prefix)}


def _use_conf(tray: Path, name: str) -> None:
    shutil.copy(DATA / "broken" / name, tray / "etc/slurm/slurm.conf")


# ---------------------------------------------------------------- the whole tray


def test_good_tray_passes_every_check(make_rt: Any) -> None:
    """On a tray set up as docs/install.md says, every check is OK and the exit code is 0."""
    checks = _checks(make_rt())
    assert {name for name, st in _statuses(checks).items() if st != doctor.OK} == set(), [
        c for c in checks.values() if c.status != doctor.OK
    ]
    assert {"slurm.prolog", "imex.version", "ports.ephemeral", "nvml.gpu3"} <= set(checks)
    assert doctor.exit_code(list(checks.values())) == 0


def test_every_check_name_is_in_the_catalogue(make_rt: Any, gpu: FakeGpu) -> None:
    """Every name doctor reports is in doctor_run.CHECK_NAMES (docs/operations.md's table), in its order.

    Without a container toolkit or enroot on the tray, their detail checks are not reported;
    without --nodes, resolve.nodes is not.
    """
    names = [c.name for c in doctor_run.run(doctor.Context(make_rt(), {}, "gb01"))]
    general = list(dict.fromkeys("nvml.gpu<N>" if n.startswith("nvml.gpu") else n for n in names))
    absent = {n for n in doctor_run.CHECK_NAMES if n.startswith(("containers.toolkit.", "containers.enroot."))}
    absent.add("resolve.nodes")
    assert general == [n for n in doctor_run.CHECK_NAMES if n not in absent]


def test_container_toolkit_is_checked_with_its_version(make_rt: Any, tray: Path, host: FakeHost) -> None:
    """With the toolkit installed, doctor runs the tray's nvidia-ctk --version and reports its IMEX settings."""
    ctk = tray / "usr/bin/nvidia-ctk"
    ctk.write_text("#!/bin/sh\n")
    ctk.chmod(0o755)
    conf = tray / "etc/nvidia-container-runtime/config.toml"
    conf.parent.mkdir(parents=True)
    shutil.copy(DATA.parent / "containers/toolkit/risky-default.toml", conf)
    checks = _checks(make_rt())
    assert (str(ctk), "--version") in host.calls
    # 1.16.2 honours IMEX requests and has no flag to refuse them; the config does not refuse them either
    assert checks["containers.toolkit.version"].status == doctor.WARN
    assert "1.16.2" in checks["containers.toolkit.version"].message
    assert checks["containers.toolkit.imex_requests"].status == doctor.WARN
    assert doctor.exit_code(list(checks.values())) == 0


def test_cli_json_lists_name_status_message_fix(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """``doctor --json`` prints the envelope with one {name, status, message, fix} per check; exit 1 on a FAIL."""
    cfg = tray / "imexctl.conf"
    cfg.write_text(f"[paths]\nroot = {tray}\n[commands]\nnvidia_imex = {tray}/usr/bin/nope\n")
    cfg.chmod(0o644)
    code = cli.main(["--config", str(cfg), "doctor", "--json"], env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=gpu)
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["exit_code"] == 1 and out["errors"][0]["code"] == "doctor_failed"
    assert all(set(c) == {"name", "status", "message", "fix"} for c in out["data"])
    assert {c["name"]: c["status"] for c in out["data"]}["imex.binaries"] == "FAIL"
    assert "imex.binaries" in out["errors"][0]["message"]


def test_cli_text_exits_0_with_warnings_only(tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """The text form shows each WARN with its fix, and WARNs alone leave the exit code 0 (a health check passes)."""
    _use_conf(tray, "no-deferbatch.conf")
    cfg = tray / "imexctl.conf"
    cfg.write_text(
        f"[paths]\nroot = {tray}\n[daemon]\nbackend = exec\n[commands]\n"
        f"nvidia_imex = {tray}/usr/bin/nvidia-imex\nnvidia_imex_ctl = {tray}/usr/bin/nvidia-imex-ctl\n"
    )
    cfg.chmod(0o644)
    code = cli.main(["--config", str(cfg), "doctor"], env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=gpu)
    out = capsys.readouterr().out
    assert code == 0
    assert "WARN  slurm.prolog_flags: PrologFlags=alloc" in out
    assert "      fix: add DeferBatch" in out
    assert out.splitlines()[-1].endswith("1 warnings, 0 failed")


def test_broken_config_is_a_fail_and_the_other_checks_still_run(
    tray: Path, host: FakeHost, gpu: FakeGpu, capsys: Any
) -> None:
    """A config that does not load is one FAIL naming the key; the rest runs with the defaults."""
    cfg = tray / "imexctl.conf"
    cfg.write_text("[readiness]\ndeadline_s = soon\n")
    cfg.chmod(0o644)
    code = cli.main(["--config", str(cfg), "doctor", "--json"], env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=gpu)
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)["data"]}
    assert code == 1
    assert data["imexctl.config"]["status"] == "FAIL" and "deadline_s" in data["imexctl.config"]["message"]
    assert "nvml.fabric" in data and "ports.ephemeral" in data


def test_every_message_is_one_line(make_rt: Any, host: FakeHost) -> None:
    """A command's multi-line stderr becomes one line of the check's message."""
    host.fail_verbs = {"show"}
    checks = _checks(make_rt())
    assert checks["imex.stock_unit"].status == doctor.WARN
    assert all("\n" not in c.message for c in checks.values())


# ---------------------------------------------------------------- slurm.conf


SLURM_CHECKS = (
    "slurm.conf",
    "slurm.version",
    "slurm.prolog",
    "slurm.epilog",
    "slurm.prolog_flags",
    "slurm.prolog_timeout",
    "slurm.epilog_timeout",
    "slurm.batch_start_timeout",
    "slurm.timeout_keys",
    "slurm.partitions",
    "slurm.preempt",
    "slurm.switch",
    "slurm.topology",
)


@pytest.mark.parametrize(
    ("name", "flagged"),
    [
        ("no-prolog.conf", {"slurm.prolog": "FAIL"}),
        ("prolog-elsewhere.conf", {"slurm.prolog": "FAIL"}),
        ("no-epilog.conf", {"slurm.epilog": "FAIL"}),
        ("no-alloc.conf", {"slurm.prolog_flags": "FAIL"}),
        ("no-deferbatch.conf", {"slurm.prolog_flags": "WARN"}),
        ("no-timeout.conf", {"slurm.prolog_timeout": "WARN", "slurm.epilog_timeout": "WARN"}),
        ("short-timeout.conf", {"slurm.prolog_timeout": "WARN", "slurm.epilog_timeout": "WARN"}),
        ("short-prolog-timeout.conf", {"slurm.prolog_timeout": "WARN"}),
        ("short-batch-start.conf", {"slurm.batch_start_timeout": "WARN"}),
        ("switch-imex.conf", {"slurm.switch": "WARN"}),
        ("block-no-topology.conf", {"slurm.topology": "WARN"}),
    ],
)
def test_each_broken_slurm_conf_is_flagged_and_nothing_else(
    tray: Path, make_rt: Any, name: str, flagged: dict[str, str]
) -> None:
    """Each broken slurm.conf in tests/data/doctor/broken is flagged by its check, and only by it."""
    _use_conf(tray, name)
    found = _statuses(_checks(make_rt()), "slurm.")
    assert found == {**dict.fromkeys(SLURM_CHECKS, "OK"), **flagged}


@pytest.mark.parametrize(
    ("version", "status"), [("slurm 25.11.7", "FAIL"), ("slurm-wlm 26.05.5", "OK"), ("garbage", "FAIL")]
)
def test_deferbatch_implies_alloc_from_slurm_26_05(
    tray: Path, make_rt: Any, host: FakeHost, version: str, status: str
) -> None:
    """PrologFlags=DeferBatch alone: enough on 26.05 (it implies Alloc), a FAIL before; an unknown release is judged as the newest."""
    conf = tray / "etc/slurm/slurm.conf"
    conf.write_text(conf.read_text().replace("prologflags=Alloc,\\\nDeferBatch", "PrologFlags=DeferBatch"))
    assert "PrologFlags=DeferBatch\n" in conf.read_text()
    host.slurm_version_output = version + "\n"
    checks = _checks(make_rt())
    want = status if version != "garbage" else "OK"  # an unknown release is judged as the newest
    assert checks["slurm.prolog_flags"].status == want, checks["slurm.prolog_flags"]
    assert checks["slurm.version"].status == ("WARN" if version == "garbage" else "OK"), checks["slurm.version"]
    if version != "garbage":
        assert version.split()[1] in checks["slurm.version"].message


@pytest.mark.parametrize(
    ("flags", "status", "says"),
    [
        pytest.param("Alloc,DeferBatch", "OK", "waits up to 10 s for slurmctld to take the job back", id="deferbatch"),
        pytest.param("Alloc", "WARN", "asks slurmctld once", id="no-deferbatch"),
        pytest.param("Alloc,DeferBatch,NoHold", "WARN", "DeferBatch holds nothing back", id="nohold"),
    ],
)
def test_prolog_flags_say_what_a_tray_does_when_a_peer_fails(
    tray: Path, make_rt: Any, flags: str, status: str, says: str
) -> None:
    """doctor names the rule in force (issue 34 §5): wait for the requeue under DeferBatch, else one question."""
    conf = tray / "etc/slurm/slurm.conf"
    conf.write_text(conf.read_text().replace("prologflags=Alloc,\\\nDeferBatch", f"PrologFlags={flags}"))
    assert f"PrologFlags={flags}\n" in conf.read_text()
    check = _checks(make_rt())["slurm.prolog_flags"]
    assert check.status == status and says in check.message, check


@pytest.mark.parametrize(("version", "status"), [("slurm 24.11.5", "FAIL"), ("slurm 25.05.0", "OK")])
def test_prolog_timeout_key_needs_slurm_25_05(
    tray: Path, make_rt: Any, host: FakeHost, version: str, status: str
) -> None:
    """PrologTimeout in slurm.conf under a Slurm older than 25.05 is a FAIL: its daemons refuse the file."""
    _use_conf(tray, "short-prolog-timeout.conf")
    host.slurm_version_output = version + "\n"
    check = _checks(make_rt())["slurm.timeout_keys"]
    assert check.status == status and "PrologTimeout" in check.message, check


@pytest.mark.parametrize(
    ("line", "warned"),
    [
        ("PartitionName=nvl72 Nodes=gb[01-18] Default=YES OverSubscribe=EXCLUSIVE", False),
        ("PartitionName=nvl72 Nodes=gb[01-18] Default=YES", True),
        ("PartitionName=nvl72 Nodes=ALL OverSubscribe=YES:4", True),
        ("PartitionName=nvl72 Nodes=gb[01-18] Exclusive=NODE", False),
        ("PartitionName=nvl72 Nodes=gb[01-18] Exclusive=TOPO", False),
        ("PartitionName=nvl72 Nodes=gb[01-18] OverSubscribe=EXCLUSIVE Exclusive=NO", True),
        ("PartitionName=nvl72 Nodes=gb[01-18] Exclusive=USER", True),
        ("PartitionName=nvl72 Nodes=gb[01-18] ExclusiveTopo=YES", False),
        ("PartitionName=DEFAULT OverSubscribe=EXCLUSIVE\nPartitionName=nvl72 Nodes=gb[01-18]", False),
        ("PartitionName=cpu Nodes=cn[01-04]\nPartitionName=nvl72 Nodes=gb[01-18] OverSubscribe=EXCLUSIVE", False),
    ],
)
def test_partition_that_lets_jobs_share_this_tray_warns(tray: Path, make_rt: Any, line: str, warned: bool) -> None:
    """A partition holding this tray whose jobs may share it is named in a WARN; others are not."""
    nodes = tray / "etc/slurm/nodes.conf"
    nodes.write_text(re.sub(r"(?m)^PartitionName=.*$", line, nodes.read_text()))
    check = _checks(make_rt())["slurm.partitions"]
    assert (check.status == "WARN") is warned, check
    if warned:
        assert "partition nvl72 (" in check.message and "run without IMEX" in check.message, check
        assert "cpu" not in check.message, check


def test_partition_warning_says_the_drain_with_shared_refuse(tray: Path, make_rt: Any) -> None:
    """With [policy] shared = refuse the warning says such jobs drain the tray."""
    nodes = tray / "etc/slurm/nodes.conf"
    nodes.write_text(nodes.read_text().replace(" OverSubscribe=EXCLUSIVE", ""))
    check = _checks(make_rt(policy={"shared": "refuse"}))["slurm.partitions"]
    assert check.status == "WARN" and "drain the tray" in check.message, check


@pytest.mark.parametrize(
    ("conf", "partitions", "warned"),
    [
        pytest.param("", "", "", id="no-preemption"),
        pytest.param("PreemptType=preempt/partition_prio\nPreemptMode=SUSPEND,GANG\n", "", "nvl72", id="global"),
        pytest.param("PreemptType=preempt/qos\nPreemptMode=suspend\n", "", "nvl72", id="global-suspend-lower"),
        pytest.param("PreemptMode=GANG\n", "", "nvl72", id="gang-time-slicing"),
        pytest.param("PreemptMode=SUSPEND\n", "", "", id="suspend-without-preempt-type"),
        pytest.param("PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n", "", "", id="requeue"),
        pytest.param(
            "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n",
            " PreemptMode=SUSPEND",
            "nvl72",
            id="partition-suspends",
        ),
        pytest.param(
            "PreemptType=preempt/partition_prio\nPreemptMode=SUSPEND,GANG\n",
            " PreemptMode=REQUEUE",
            "nvl72",
            id="partition-requeues-but-gang-is-global",
        ),
        pytest.param(
            "PreemptType=preempt/partition_prio\nPreemptMode=SUSPEND\n",
            " PreemptMode=CANCEL",
            "",
            id="partition-cancels",
        ),
    ],
)
def test_suspend_or_gang_preemption_of_a_partition_with_imex_trays_warns(
    tray: Path, make_rt: Any, conf: str, partitions: str, warned: str
) -> None:
    """PreemptMode=SUSPEND (with a PreemptType) or GANG for a partition holding this tray: WARN naming it;
    a partition that does not hold the tray (cpu) is never named."""
    nodes = tray / "etc/slurm/nodes.conf"
    text = re.sub(r"(?m)^PartitionName=.*$", "PartitionName=nvl72 Nodes=gb[01-18] OverSubscribe=EXCLUSIVE" + partitions
                  + "\nPartitionName=cpu Nodes=cn[01-04] PreemptMode=SUSPEND", nodes.read_text())  # fmt: skip
    nodes.write_text(conf + text)
    check = _checks(make_rt())["slurm.preempt"]
    assert check.status == ("WARN" if warned else "OK"), check
    if warned:
        assert f"partition {warned} (PreemptMode=" in check.message and "domain_busy" in check.message, check
        assert "cpu" not in check.message and "REQUEUE or CANCEL" in (check.fix or ""), check


@pytest.mark.parametrize(("name", "words"), [("missing-include.conf", "no such file"), ("malformed.conf", "not a")])
def test_unreadable_slurm_conf_is_one_fail(tray: Path, make_rt: Any, name: str, words: str) -> None:
    """A slurm.conf that slurmd could not read either is one FAIL with file and reason."""
    _use_conf(tray, name)
    checks = _checks(make_rt())
    assert _statuses(checks, "slurm.") == {"slurm.conf": "FAIL"}
    assert words in checks["slurm.conf"].message


def test_good_conf_reports_includes_and_hook_positions(tray: Path, make_rt: Any) -> None:
    """The good file: its includes are counted, the prolog hook runs last and the epilog hook (a symlink) first."""
    checks = _checks(make_rt())
    assert "and 2 included file(s)" in checks["slurm.conf"].message
    assert "00-imexctl runs /opt/imexctl/bin/imexctl prolog (script 2 of 2)" in checks["slurm.prolog"].message
    assert "99-imexctl runs /opt/imexctl/bin/imexctl epilog (script 1 of 2)" in checks["slurm.epilog"].message


def test_short_timeout_fails_without_the_deadline_cap(tray: Path, make_rt: Any) -> None:
    """With [slurm] cap_deadline = no, a timeout below deadline plus margin is a FAIL (slurmd kills the prolog)."""
    _use_conf(tray, "short-timeout.conf")
    check = _checks(make_rt(slurm={"cap_deadline": "no"}))["slurm.prolog_timeout"]
    assert check.status == doctor.FAIL
    assert "PrologEpilogTimeout=30 is not above" in check.message and "70 s" in check.message


def test_timeout_below_the_worst_case_warns(tray: Path, make_rt: Any) -> None:
    """A timeout above deadline plus margin but below the prolog's worst case (119 s by default) is a WARN."""
    conf = tray / "etc/slurm/slurm.conf"
    conf.write_text(conf.read_text().replace("PrologEpilogTimeout=120", "PrologEpilogTimeout=100"))
    check = _checks(make_rt())["slurm.prolog_timeout"]
    assert check.status == doctor.WARN and "worst case 119 s" in check.message
    assert check.fix.startswith("set PrologEpilogTimeout=120")


@pytest.mark.parametrize(("wait", "status"), [("20", doctor.OK), ("60", doctor.WARN)])
def test_the_epilogs_wait_for_the_jobs_processes_counts_in_its_worst_case(
    tray: Path, make_rt: Any, wait: str, status: str
) -> None:
    """[daemon] process_wait_s adds to the epilog's worst case (89 s by default under 120): 60 s makes it 129 s."""
    check = _checks(make_rt(daemon={"process_wait_s": wait}))["slurm.epilog_timeout"]
    assert check.status == status and f"worst case {69 + int(wait)} s" in check.message, check
    assert _checks(make_rt(daemon={"process_wait_s": wait}))["slurm.prolog_timeout"].status == doctor.OK


def test_switch_plugin_with_channels_none_is_ok(tray: Path, make_rt: Any) -> None:
    """switch/nvidia_imex with [policy] channels = none: Slurm makes the channel, as configured."""
    _use_conf(tray, "switch-imex.conf")
    check = _checks(make_rt(policy={"channels": "none"}))["slurm.switch"]
    assert check.status == doctor.OK and "switch/nvidia_imex" in check.message


def test_channels_none_without_the_plugin_warns(make_rt: Any) -> None:
    """[policy] channels = none without Slurm's plugin: nobody makes a channel."""
    check = _checks(make_rt(policy={"channels": "none"}))["slurm.switch"]
    assert check.status == doctor.WARN and "neither Slurm nor imexctl" in check.message


def test_hook_that_is_not_executable_fails(tray: Path, make_rt: Any) -> None:
    """slurmd cannot run a hook without the execute bit."""
    (tray / "etc/slurm/prolog.d/00-imexctl").chmod(0o644)
    check = _checks(make_rt())["slurm.prolog"]
    assert check.status == doctor.FAIL and "not executable" in check.message


def test_hook_whose_imexctl_is_missing_fails(tray: Path, make_rt: Any) -> None:
    """A hook that execs an imexctl that is not installed fails."""
    (tray / "opt/imexctl/bin/imexctl").unlink()
    checks = _checks(make_rt())
    assert checks["slurm.prolog"].status == doctor.FAIL
    assert "execs /opt/imexctl/bin/imexctl, which does not exist" in checks["slurm.prolog"].message


def test_hook_that_others_can_change_fails(tray: Path, make_rt: Any) -> None:
    """A group-writable hook script, which slurmd runs as root, fails."""
    (tray / "etc/slurm/prolog.d/00-imexctl").chmod(0o775)
    assert _checks(make_rt())["slurm.prolog"].status == doctor.FAIL


def test_prolog_hook_that_does_not_run_last_warns(tray: Path, make_rt: Any) -> None:
    """A prolog hook that sorts after the site's scripts runs first (reverse order): a WARN."""
    d = tray / "etc/slurm/prolog.d"
    (d / "00-imexctl").rename(d / "90-imexctl")
    check = _checks(make_rt())["slurm.prolog"]
    assert check.status == doctor.WARN and "(script 1 of 2)" in check.message


def test_slurm_conf_from_the_environment_and_the_option(tray: Path, make_rt: Any) -> None:
    """$SLURM_CONF is read when set, and --slurm-conf wins over it."""
    rt = make_rt()
    broken = tray / "etc/slurm/test.conf"
    shutil.copy(DATA / "broken/no-alloc.conf", broken)
    env_checks = _checks(rt, {"SLURM_CONF": str(broken)})
    assert env_checks["slurm.prolog_flags"].status == doctor.FAIL
    assert str(broken) in env_checks["slurm.conf"].message
    chosen = _checks(rt, {"SLURM_CONF": str(broken)}, slurm_conf=tray / "etc/slurm/slurm.conf")
    assert chosen["slurm.prolog_flags"].status == doctor.OK


def test_configless_copy_is_found(tray: Path, make_rt: Any) -> None:
    """Without /etc/slurm/slurm.conf, the configless copy in /run/slurm/conf is read."""
    shutil.move(str(tray / "etc/slurm/slurm.conf"), tray / "etc/slurm/x")
    (tray / "run/slurm/conf").mkdir(parents=True)
    shutil.copy(DATA / "broken/no-deferbatch.conf", tray / "run/slurm/conf/slurm.conf")
    shutil.copy(DATA / "etc/slurm/nodes.conf", tray / "run/slurm/conf/nodes.conf")
    checks = _checks(make_rt())
    assert str(tray / "run/slurm/conf/slurm.conf") in checks["slurm.conf"].message
    assert checks["slurm.prolog_flags"].status == doctor.WARN


def test_no_slurm_conf_is_a_warning(tray: Path, make_rt: Any) -> None:
    """No slurm.conf anywhere: one WARN that says where doctor looked."""
    (tray / "etc/slurm/slurm.conf").unlink()
    checks = _checks(make_rt())
    assert _statuses(checks, "slurm.") == {"slurm.conf": "WARN"}
    assert "/etc/slurm/slurm.conf" in checks["slurm.conf"].message


def _topology(tray: Path, text: str) -> Path:
    path = tray / "etc/slurm/topology.conf"
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_topology_file_that_parses_and_lists_the_node_is_ok(tray: Path, make_rt: Any) -> None:
    """The topology file imexctl reads parses and puts this node in a block."""
    _topology(tray, "BlockName=r1 Nodes=gb[01-18]\nBlockSizes=18\n")
    check = _checks(make_rt(paths={"topology_file": "/etc/slurm/topology.conf"}))["slurm.topology"]
    assert check.status == doctor.OK and "gb01 is in BlockName= block r1" in check.message


def test_topology_file_without_this_node_fails(tray: Path, make_rt: Any) -> None:
    """A topology file that does not list this node fails: every prolog here exits 78."""
    _topology(tray, "BlockName=r2 Nodes=gb[19-36]\n")
    check = _checks(make_rt(paths={"topology_file": "/etc/slurm/topology.conf"}))["slurm.topology"]
    assert check.status == doctor.FAIL and "in no BlockName= block" in check.message


def test_topology_file_that_does_not_parse_fails(tray: Path, make_rt: Any) -> None:
    """A malformed topology file is a FAIL naming the file."""
    _topology(tray, "BlockName=r1\n")
    check = _checks(make_rt(paths={"topology_file": "/etc/slurm/topology.conf"}))["slurm.topology"]
    assert check.status == doctor.FAIL and "topology.conf" in check.message


def test_missing_topology_file_fails(tray: Path, make_rt: Any) -> None:
    """A configured topology file that does not exist fails."""
    check = _checks(make_rt(paths={"topology_file": "/etc/slurm/topology.conf"}))["slurm.topology"]
    assert check.status == doctor.FAIL and "cannot read topology file" in check.message


@pytest.mark.parametrize(
    ("sections", "status"),
    [({}, doctor.FAIL), ({"policy": {"channels": "none"}}, doctor.OK)],
    ids=["channels-job", "channels-none"],
)
def test_a_node_slurm_conf_does_not_list_has_no_channel_place(tray: Path, make_rt: Any,
                                                              sections: dict[str, dict[str, str]],
                                                              status: str) -> None:  # fmt: skip
    """No topology source and slurm.conf does not list this node (a dynamic node): its prologs refuse IMEX, since its
    channel has no place in a clique; doctor fails ahead of them and says to configure a topology source."""
    (tray / "etc/slurm/nodes.conf").write_text("NodeName=gb[02-18] CPUs=144\nPartitionName=nvl72 Nodes=gb[02-18]\n")
    check = _checks(make_rt(**sections))["slurm.topology"]
    assert check.status == status, check
    if status == doctor.FAIL:
        assert "slurm.conf does not list this node gb01" in check.message and "prologs refuse IMEX" in check.message
        assert "[topology] source" in check.fix


# ---------------------------------------------------------------- IMEX


def test_missing_binaries_fail(make_rt: Any, tray: Path) -> None:
    """A missing nvidia-imex-ctl fails imex.binaries; the version is then not checked."""
    (tray / "usr/bin/nvidia-imex-ctl").unlink()
    checks = _checks(make_rt())
    assert checks["imex.binaries"].status == doctor.FAIL and "nvidia-imex-ctl" in checks["imex.binaries"].message
    assert checks["imex.version"].status == doctor.OK


def test_imex_version_other_than_the_driver_fails(make_rt: Any, host: FakeHost, tray: Path) -> None:
    """nvidia-imex of another version than the loaded driver fails (the daemon aborts)."""
    host.imex_version_output = "IMEX version is: 580.82.07\n"
    check = _checks(make_rt())["imex.version"]
    assert check.status == doctor.FAIL
    assert "580.82.07 but the driver is 580.95.05" in check.message
    assert (f"{tray}/usr/bin/nvidia-imex", "--version") in host.calls


def test_imex_version_without_a_driver_warns(make_rt: Any, tray: Path) -> None:
    """No /proc/driver/nvidia/version: the version is a WARN, not a FAIL."""
    (tray / "proc/driver/nvidia/version").unlink()
    check = _checks(make_rt())["imex.version"]
    assert check.status == doctor.WARN and "unknown" in check.message


@pytest.mark.parametrize(
    ("props", "status", "words"),
    [
        ({"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}, "FAIL", "is active"),
        ({"LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "enabled"}, "FAIL", "next boot"),
        ({"LoadState": "masked", "ActiveState": "inactive", "UnitFileState": "masked"}, "OK", "masked"),
        ({"LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled"}, "FAIL", "not masked"),
        ({"LoadState": "not-found", "ActiveState": "inactive"}, "OK", "not installed"),
    ],
)
def test_stock_unit(make_rt: Any, host: FakeHost, props: dict[str, str], status: str, words: str) -> None:
    """With the systemd backend the stock nvidia-imex.service must be masked (or not installed)."""
    host.units["nvidia-imex.service"] = props
    check = _checks(make_rt())["imex.stock_unit"]
    assert check.status == status and words in check.message
    if status == "FAIL":
        assert check.fix == "systemctl disable --now nvidia-imex.service && systemctl mask nvidia-imex.service"
    show = [c for c in host.calls if c[:2] == ("/usr/bin/systemctl", "show")]
    assert show and show[0][-2:] == ("nvidia-imex.service", "imexctl-imex@1.service")


def test_stock_unit_disabled_is_enough_with_the_exec_backend(make_rt: Any, host: FakeHost) -> None:
    """The exec backend's daemons have no Conflicts= on the stock unit: disabled (not running) is OK."""
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled"}
    check = _checks(make_rt(daemon={"backend": "exec"}))["imex.stock_unit"]
    assert check.status == "OK" and "disabled" in check.message


def test_template_unit_not_installed_fails(make_rt: Any, host: FakeHost) -> None:
    """With the systemd backend, a template unit that is not loaded fails."""
    host.units["imexctl-imex@1.service"] = {"LoadState": "not-found"}
    check = _checks(make_rt())["imex.unit"]
    assert check.status == doctor.FAIL and "not-found" in check.message


def test_template_unit_running_another_config_fails(make_rt: Any, host: FakeHost) -> None:
    """A unit whose ExecStart does not run imexctl's config path fails."""
    host.unit_exec = "/usr/bin/nvidia-imex -c /run/imexctl/jobs/{job}/config.cfg"
    check = _checks(make_rt())["imex.unit"]
    assert check.status == doctor.FAIL and "does not run" in check.message


def test_exec_backend_needs_no_unit(make_rt: Any, host: FakeHost) -> None:
    """With [daemon] backend = exec the template unit is not checked."""
    host.units["imexctl-imex@1.service"] = {"LoadState": "not-found"}
    assert _checks(make_rt(daemon={"backend": "exec"}))["imex.unit"].status == doctor.OK


def test_channel_device_missing_fails(make_rt: Any, tray: Path) -> None:
    """No nvidia-caps-imex-channels in /proc/devices fails with channels = job, and is not checked with none."""
    (tray / "proc/devices").write_text("Character devices:\n195 nvidia\nBlock devices:\n")
    assert _checks(make_rt())["imex.channel_device"].status == doctor.FAIL
    assert "imex.channel_device" not in _checks(make_rt(policy={"channels": "none"}))


def test_driver_channel_count_below_the_config_fails(make_rt: Any, tray: Path) -> None:
    """NVreg_ImexChannelCount smaller than [policy] channel_count fails and says which value to set."""
    (tray / "proc/driver/nvidia/params").write_text("ImexChannelCount: 128\n")
    check = _checks(make_rt())["imex.channel_count"]
    assert check.status == doctor.FAIL and check.fix == "set [policy] channel_count = 128"


@pytest.mark.parametrize(("count", "status"), [(16, doctor.WARN), (17, doctor.OK)])
def test_a_clique_with_more_trays_than_channels_warns(make_rt: Any, tray: Path, count: int, status: str) -> None:
    """A topology block of 16 trays: with 16 channels (15 numbers) two of its domains can share one: WARN."""
    (tray / "proc/driver/nvidia/params").write_text(f"ImexChannelCount: {count}\n")
    (tray / "etc/slurm").mkdir(parents=True, exist_ok=True)
    key = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b"
    text = (
        f"BlockName=r1 Nodes=gb[01-16]  # imexctl-key: {key}.1\nBlockName=r2 Nodes=gb[17-18]  # imexctl-key: {key}.2\n"
    )
    (tray / "etc/slurm/topology.conf").write_text(text)
    rt = make_rt(policy={"channel_count": str(count)}, paths={"topology_file": "/etc/slurm/topology.conf"})
    check = _checks(rt)["imex.channel_count"]
    assert check.status == status, check
    if status == doctor.WARN:
        assert "largest NVLink clique has 16 trays" in check.message and "above 16" in check.fix


@pytest.mark.parametrize(
    ("lines", "keyless"),
    [
        ("BlockName=r1 Nodes=gb[01-02]\nBlockName=r2 Nodes=gb[03-04]\n", "blocks r1, r2"),
        ("BlockName=r1 Nodes=gb[01-02]  # imexctl-key: 4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.1\nBlockName=r2 Nodes=gb[03-04]\n",
         "block r2"),
    ],
    ids=["none-keyed", "one-keyless"],
)  # fmt: skip
def test_blocks_without_a_key_warn(make_rt: Any, tray: Path, lines: str, keyless: str) -> None:
    """Blocks with no NVLink domain key may split one clique: the whole file counts as one, and doctor says so and
    how to give them keys."""
    (tray / "proc/driver/nvidia/params").write_text("ImexChannelCount: 2048\n")
    (tray / "etc/slurm").mkdir(parents=True, exist_ok=True)
    (tray / "etc/slurm/topology.conf").write_text(lines)
    check = _checks(make_rt(paths={"topology_file": "/etc/slurm/topology.conf"}))["imex.channel_count"]
    assert check.status == doctor.WARN, check
    assert f"{keyless} of " in check.message and "all 4 trays of the file count as one clique" in check.message
    assert "imexctl topology blocks" in check.fix and "topology_map" in check.fix


def test_a_topology_map_that_names_every_tray_gives_the_blocks_keys(make_rt: Any, tray: Path) -> None:
    """The same keyless file with a [paths] topology_map naming every tray: the blocks have keys, no warning."""
    (tray / "proc/driver/nvidia/params").write_text("ImexChannelCount: 2048\n")
    (tray / "etc/slurm").mkdir(parents=True, exist_ok=True)
    (tray / "etc/slurm/topology.conf").write_text("BlockName=r1 Nodes=gb[01-02]\nBlockName=r2 Nodes=gb[03-04]\n")
    key = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b"
    (tray / "etc/slurm/imex.map").write_text("".join(f"gb0{i} {key}.{1 + (i > 2)}\n" for i in range(1, 5)))
    paths = {"topology_file": "/etc/slurm/topology.conf", "topology_map": "/etc/slurm/imex.map"}
    check = _checks(make_rt(paths=paths))["imex.channel_count"]
    assert check.status == doctor.OK, check


# ---------------------------------------------------------------- ports


def test_port_range_in_the_ephemeral_range_fails(make_rt: Any) -> None:
    """A [ports] range inside the kernel's ephemeral range fails; the fix says the ranges must be open in the rack."""
    check = _checks(make_rt(ports={"server_port_range": "50000-50999"}))["ports.ephemeral"]
    assert check.status == doctor.FAIL
    assert "server_port_range 50000-50999 overlaps the ephemeral range 32768-60999 (1000 ports" in check.message
    assert "open (TCP) between the trays of a rack" in check.fix


def test_reserved_ports_do_not_clash(make_rt: Any, tray: Path) -> None:
    """A range inside the ephemeral range but in ip_local_reserved_ports is fine."""
    (tray / "proc/sys/net/ipv4/ip_local_reserved_ports").write_text("8080,50000-50999\n")
    assert _checks(make_rt(ports={"server_port_range": "50000-50999"}))["ports.ephemeral"].status == doctor.OK


def test_listener_in_the_ranges_fails(make_rt: Any, tray: Path) -> None:
    """A program listening on a port of the ranges fails, with the port named."""
    (tray / "proc/net/tcp6").write_text(TCP_HEADER + _listen(62007))
    check = _checks(make_rt())["ports.listening"]
    assert check.status == doctor.FAIL and "62007" in check.message


def test_a_jobs_own_daemon_port_is_no_finding(make_rt: Any, tray: Path, host: FakeHost) -> None:
    """The running job's daemon listening on its ports is not reported."""
    rt = make_rt()
    jd = rt.settings.paths.job(7)
    jd.path.mkdir(parents=True)
    state = {"job_id": 7, "node": "gb01", "uid": 1000, "gid": 1000, "user": "u", "nodes": ["gb01"]}
    state |= {"addresses": ["10.0.0.1"], "port": 61007, "backend": "exec", "channel_minor": None}
    state |= {"channel_path": "", "created": 0.0, "cmd_port": 62007}
    jd.state.write_text(json.dumps(state))
    host.running_jobs.add(7)
    (tray / "proc/net/tcp").write_text(TCP_HEADER + _listen(61007) + _listen(62007))
    assert _checks(rt)["ports.listening"].status == doctor.OK


def _users_listener(tray: Path, address: str = "00000000", port: int = 61042, pid: int = 4242) -> None:
    """uid 1501's ``python3 -m http.server`` listening on ``address:port`` (kernel hex), as /proc shows it."""
    line = f"   1: {address}:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1501 0 {pid} 1\n"
    (tray / "proc/net/tcp").write_text(TCP_HEADER + _listen(22) + line)
    proc = tray / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "status").write_text("Name:\tpython3\nUid:\t1501\t1501\t1501\t1501\n")
    (proc / "cmdline").write_bytes(b"python3\0-m\0http.server\0" + str(port).encode() + b"\0")
    (proc / "fd/3").symlink_to(f"socket:[{pid}]")
    with (tray / "etc/passwd").open("a") as f:
        f.write("imexlab:x:1501:1502::/home/imexlab:/bin/sh\n")


def test_a_local_users_listener_in_the_ranges_warns_naming_it(make_rt: Any, tray: Path) -> None:
    """A local user's listener in the ranges: WARN (no fault of the tray), named as the prolog names it."""
    _users_listener(tray)
    checks = _checks(make_rt())
    check = checks["ports.listening"]
    assert check.status == doctor.WARN, check
    assert "0.0.0.0:61042 held by pid 4242 (uid 1501 imexlab: python3 -m http.server 61042)" in check.message
    assert "port guard" in check.fix
    assert doctor.exit_code(list(checks.values())) == 0


def test_a_local_users_loopback_listener_holds_no_jobs_port(make_rt: Any, tray: Path) -> None:
    """127.0.0.1:61042 is not the tray's address, which the prolog binds: no finding."""
    _users_listener(tray, address="0100007F")
    assert _checks(make_rt())["ports.listening"].status == doctor.OK


def test_the_port_guard_is_ok_on_a_guarded_tray(make_rt: Any, host: FakeHost) -> None:
    """systemd with BPF_FRAMEWORK, cgroup v2, the logins' slice denies the ranges: OK, saying so; the jobs' scope,
    guarded or not (it is optional: netcheck binds the ranges from a job step), is named either way."""
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.OK, check
    assert "user.slice refuses bind() in 61000-61999 and 62000-62999" in check.message, check
    assert check.message.endswith("; slurmstepd.scope too"), check
    host.unit_lists[JOBS_SCOPE] = {}
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.OK and "slurmstepd.scope does not (the jobs' steps; optional" in check.message


def test_a_systemd_without_bpf_framework_guards_nothing(make_rt: Any, host: FakeHost) -> None:
    """Debian 12's systemd 252 shows SocketBindDeny= and enforces nothing (measured): WARN, naming the build."""
    features = "+PAM +AUDIT +SECCOMP -BPF_FRAMEWORK -XKBCOMMON +UTMP default-hierarchy=unified"
    host.systemd_version_output = f"systemd 252 (252.39-1~deb12u2)\n{features}\n"
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.WARN, check
    assert "systemd 252 (252.39-1~deb12u2) is built without BPF_FRAMEWORK" in check.message
    assert "port_held" in check.message and "port-guard" in check.fix


def test_no_cgroup_v2_guards_nothing(make_rt: Any, tray: Path) -> None:
    """Without a unified cgroup hierarchy systemd attaches no bind program: WARN."""
    (tray / "sys/fs/cgroup/cgroup.controllers").unlink()
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.WARN and "no unified cgroup hierarchy" in check.message, check


def test_a_unit_without_the_rule_is_named(make_rt: Any, host: FakeHost) -> None:
    """The logins' slice has no rule: WARN naming user.slice and what its processes may bind."""
    host.unit_lists[GUARDED] = {}
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.WARN, check
    assert "user.slice lets its processes bind 2000 of their ports over IPv4 and 2000 of their ports over IPv6" in (
        check.message
    )
    assert "slurmstepd.scope" not in check.message


@pytest.mark.parametrize(
    ("deny", "allow", "left"),
    [
        (["ipv4:tcp61000-62999"], [], "2000 of their ports over IPv6"),
        (["tcp61000-61999"], [], "1000 of their ports over IPv4"),
        (["udp61000-62999"], [], "2000 of their ports over IPv4"),
        (["tcp61000-62999"], ["tcp61500"], "1 of their ports over IPv4"),
        (["ipv4:tcp61000-62999", "ipv6:61000-62999"], [], ""),
        (["any"], [], ""),
    ],
)
def test_a_rule_must_cover_both_ranges_over_tcp_and_both_families(
    make_rt: Any, host: FakeHost, deny: list[str], allow: list[str], left: str
) -> None:
    """Only ports denied over TCP, IPv4 and IPv6 alike, and not allowed again, are guarded."""
    host.unit_lists[GUARDED] = {"SocketBindDeny": deny, "SocketBindAllow": allow}
    check = _checks(make_rt())["ports.guard"]
    assert (check.status == doctor.OK) == (not left), check
    if left:
        assert f"user.slice lets its processes bind {left}" in check.message, check


def test_other_ranges_need_their_own_rule(make_rt: Any) -> None:
    """[ports] moved to 63000-64999: the shipped default rule guards none of it."""
    ports = {"server_port_range": "63000-63999", "cmd_port_range": "64000-64999"}
    check = _checks(make_rt(ports=ports))["ports.guard"]
    assert check.status == doctor.WARN and "bind() in" not in check.message, check
    assert "in 63000-63999 and 64000-64999 and fail its prolog" in check.message


def test_a_scope_that_does_not_run_is_judged_by_its_drop_ins(make_rt: Any, host: FakeHost, tray: Path) -> None:
    """slurmstepd.scope not loaded now (slurmd makes it): its drop-in files decide; one that leaves ports open
    WARNs, a whole one is OK, and an empty line resets the list (no guard there: OK, it is optional)."""
    del host.units[JOBS_SCOPE], host.unit_lists[JOBS_SCOPE]
    drop = tray / "etc/systemd/system/slurmstepd.scope.d"
    drop.mkdir(parents=True)
    (drop / "imexctl-port-guard.conf").write_text("[Scope]\nSocketBindDeny=ipv4:tcp:61000-62999\n")
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.WARN and "slurmstepd.scope has a rule that lets its processes bind 2000" in (
        check.message
    ), check
    (drop / "imexctl-port-guard.conf").write_text("[Scope]\nSocketBindDeny=tcp:61000-62999\n")
    assert _checks(make_rt())["ports.guard"].message.endswith("slurmstepd.scope too")
    (drop / "zz-site.conf").write_text("[Scope]\nSocketBindDeny=\n")
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.OK and "slurmstepd.scope does not" in check.message, check


def test_the_shipped_drop_ins_guard_the_default_ranges(make_rt: Any, host: FakeHost, tray: Path) -> None:
    """systemd/port-guard.*.conf, installed as docs/install.md says, pass the check."""
    for unit, name in ((GUARDED, "slice"), (JOBS_SCOPE, "scope")):
        del host.units[unit], host.unit_lists[unit]
        drop = tray / "etc/systemd/system" / f"{unit}.d"
        drop.mkdir(parents=True)
        shutil.copy(REPO / f"systemd/port-guard.{name}.conf", drop / "imexctl-port-guard.conf")
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.OK and check.message.endswith("slurmstepd.scope too"), check


def test_systemd_that_cannot_be_asked_warns(make_rt: Any, host: FakeHost) -> None:
    """No answer from systemctl: WARN, the guard unknown."""
    host.fail_verbs.add("show")
    check = _checks(make_rt())["ports.guard"]
    assert check.status == doctor.WARN and "cannot ask systemd" in check.message, check


# ---------------------------------------------------------------- NVML


def test_nvml_error_fails(make_rt: Any, gpu: FakeGpu) -> None:
    """NVML failing is a FAIL: with fabric = nvml every prolog would exit 69."""
    gpu.error = GpuError("NVML init failed: driver not loaded")
    check = _checks(make_rt())["nvml.fabric"]
    assert check.status == doctor.FAIL and "NVML init failed" in check.message


def test_no_fabric_warns(make_rt: Any, gpu: FakeGpu) -> None:
    """A tray without a multi-node NVLink fabric warns: every job is skipped here."""
    gpu.infos = [None, None]
    checks = _checks(make_rt())
    assert checks["nvml.fabric"].status == doctor.WARN
    assert not [n for n in checks if n.startswith("nvml.gpu")]


@pytest.mark.parametrize(
    ("summary", "limited", "status"),
    [(2, "warn", "FAIL"), (3, "warn", "WARN"), (3, "refuse", "FAIL"), (1, "warn", "OK")],
    ids=["unhealthy", "limited-warn", "limited-refuse", "healthy"],
)
def test_gpu_health(make_rt: Any, gpu: FakeGpu, summary: int, limited: str, status: str) -> None:
    """Each GPU's fabric health: UNHEALTHY fails, LIMITED_CAPACITY follows [policy] fabric_limited."""
    gpu.infos = [FabricInfo(i, b"\x11" * 16, 7, 3, 0, 0, summary if i == 2 else 1) for i in range(4)]
    checks = _checks(make_rt(policy={"fabric_limited": limited}))
    assert checks["nvml.gpu2"].status == status
    assert checks["nvml.gpu1"].status == doctor.OK


def test_pending_registration_warns(make_rt: Any, gpu: FakeGpu) -> None:
    """A GPU whose fabric registration is still IN_PROGRESS is a WARN for that GPU."""
    gpu.infos = [FabricInfo(0, b"\x11" * 16, 7, 2, 0), FabricInfo(1, b"\x11" * 16, 7, 3, 0)]
    checks = _checks(make_rt())
    assert checks["nvml.gpu0"].status == doctor.WARN and "pending" in checks["nvml.gpu0"].message
    assert checks["nvml.fabric"].status == doctor.FAIL


def test_fabric_none_is_not_checked(make_rt: Any, gpu: FakeGpu) -> None:
    """[policy] fabric = none: NVML is never asked."""
    gpu.error = AssertionError("NVML must not be asked")
    checks = _checks(make_rt(policy={"fabric": "none"}))
    assert checks["nvml.fabric"].status == doctor.OK and gpu.calls == 0


# ---------------------------------------------------------------- imexctl itself


def test_world_writable_run_dir_fails(make_rt: Any, tray: Path) -> None:
    """A run_dir others can write fails imexctl.dirs."""
    (tray / "run/imexctl").mkdir(parents=True)
    (tray / "run/imexctl").chmod(0o777)
    check = _checks(make_rt())["imexctl.dirs"]
    assert check.status == doctor.FAIL and "mode 0777" in check.message


def test_symlinked_jobs_dir_fails(make_rt: Any, tray: Path) -> None:
    """A symlink where the jobs directory belongs fails imexctl.dirs."""
    (tray / "run/imexctl").mkdir(parents=True)
    (tray / "run/imexctl/jobs").symlink_to("/tmp")
    check = _checks(make_rt())["imexctl.dirs"]
    assert check.status == doctor.FAIL and "symbolic link" in check.message


def test_sticky_world_writable_log_dir_is_fine(make_rt: Any, tray: Path) -> None:
    """A log directory like /tmp (world-writable with the sticky bit) is not a finding."""
    (tray / "var/log").mkdir(parents=True)
    (tray / "var/log").chmod(0o1777)
    assert _checks(make_rt())["imexctl.dirs"].status == doctor.OK


def _mountinfo(tray: Path, *mounts: tuple[str, str]) -> None:
    """The tray's /proc/self/mountinfo: (mount point, file system type) in mount order."""
    (tray / "proc/self").mkdir(parents=True, exist_ok=True)
    escaped = [(point.replace(" ", "\\040"), fs) for point, fs in mounts]
    lines = [f"{20 + i} 1 0:{i} / {point} rw,relatime - {fs} {fs} rw" for i, (point, fs) in enumerate(escaped)]
    (tray / "proc/self/mountinfo").write_text("\n".join(lines) + "\n")


def _put(tray: Path, path: str, text: str) -> None:
    (tray / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (tray / path.lstrip("/")).write_text(text)


#: a stateless image: the root is the initramfs (Warewulf), /var/log a tmpfs, systemd running
STATELESS = (("/", "rootfs"), ("/run", "tmpfs"), ("/var/log", "tmpfs"))


def test_logs_on_a_disk_outlive_a_reboot(make_rt: Any, tray: Path) -> None:
    """The default log file on a disk: OK, naming the file system."""
    _mountinfo(tray, ("/", "ext4"), ("/run", "tmpfs"))
    check = _checks(make_rt())["imexctl.logs"]
    assert check.status == doctor.OK and "/var/log/imexctl.log is on ext4" in check.message


def test_logs_on_tmpfs_without_syslog_warn(make_rt: Any, tray: Path) -> None:
    """The log file on tmpfs (a stateless image) and no syslog: WARN, the fix names the stateless section."""
    _mountinfo(tray, *STATELESS)
    (tray / "run/systemd/system").mkdir(parents=True)
    check = _checks(make_rt())["imexctl.logs"]
    assert check.status == doctor.WARN
    assert "/var/log/imexctl.log is on tmpfs" in check.message and "[log] syslog = no" in check.message
    assert "docs/install.md#stateless-images" in check.fix
    _mountinfo(tray, ("/", "rootfs"), ("/run", "tmpfs"))  # no /var/log mount: the initramfs root holds it
    assert "/var/log/imexctl.log is on rootfs" in _checks(make_rt())["imexctl.logs"].message


def test_syslog_into_a_journal_on_tmpfs_is_still_lost(make_rt: Any, tray: Path) -> None:
    """[log] syslog = yes, journald persistent, but /var/log/journal on tmpfs: the journal goes too."""
    _mountinfo(tray, *STATELESS)
    (tray / "run/systemd/system").mkdir(parents=True)
    (tray / "var/log/journal").mkdir(parents=True)
    _put(tray, "/etc/systemd/journald.conf", "[Journal]\nStorage=persistent\n")
    check = _checks(make_rt(log={"syslog": "yes"}))["imexctl.logs"]
    assert check.status == doctor.WARN and "nothing forwards syslog" in check.message


def test_journal_on_a_disk_keeps_syslogged_lines(make_rt: Any, tray: Path) -> None:
    """An empty log_file, syslog on, journald auto with /var/log/journal on a disk: OK; a drop-in's volatile: WARN."""
    _mountinfo(tray, ("/", "rootfs"), ("/run", "tmpfs"), ("/var/log", "tmpfs"), ("/var/log/journal", "xfs"))
    (tray / "run/systemd/system").mkdir(parents=True)
    (tray / "var/log/journal").mkdir(parents=True)
    rt = make_rt(log={"syslog": "yes"}, paths={"log_file": ""})
    check = _checks(rt)["imexctl.logs"]
    assert check.status == doctor.OK and "journald Storage=auto keeps /var/log/journal on xfs" in check.message
    _put(tray, "/usr/lib/systemd/journald.conf.d/10-image.conf", "[Journal]\nStorage=volatile\n")
    check = _checks(rt)["imexctl.logs"]
    assert check.status == doctor.WARN and "[paths] log_file is empty" in check.message
    _put(tray, "/etc/systemd/journald.conf.d/90-site.conf", "[Journal]\nStorage=persistent\n")
    assert _checks(rt)["imexctl.logs"].status == doctor.OK


@pytest.mark.parametrize(
    ("path", "text", "found"),
    [
        (
            "/etc/rsyslog.d/50-remote.conf",
            '*.* action(type="omfwd" target="logs.example" port="514" protocol="tcp")\n',
            "rsyslog forwards it (/etc/rsyslog.d/50-remote.conf)",
        ),
        ("/etc/rsyslog.conf", "daemon.*  @@logs.example:514\n", "rsyslog forwards it (/etc/rsyslog.conf)"),
        (
            "/etc/syslog-ng/conf.d/remote.conf",
            'destination d_remote { network("logs.example" port(514)); };\n',
            "syslog-ng forwards it",
        ),
        ("/etc/systemd/system/multi-user.target.wants/systemd-journal-upload.service", "", "systemd-journal-upload"),
    ],
)
def test_syslog_forwarded_elsewhere_is_kept(make_rt: Any, tray: Path, path: str, text: str, found: str) -> None:
    """On a stateless image, syslog sent to another machine keeps the lines: OK, naming what sends them."""
    _mountinfo(tray, *STATELESS)
    (tray / "run/systemd/system").mkdir(parents=True)
    _put(tray, path, text)
    check = _checks(make_rt(log={"syslog": "yes"}))["imexctl.logs"]
    assert check.status == doctor.OK and found in check.message
    assert _checks(make_rt())["imexctl.logs"].status == doctor.WARN, "with [log] syslog = no nothing reaches it"


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("/etc/rsyslog.conf", "# *.* @@logs.example:514\n*.* /var/log/syslog\n"),
        (
            "/etc/syslog-ng/syslog-ng.conf",
            'source s_net { network(port(514)); };\ndestination d_file { file("/var/log/x"); };\n',
        ),
    ],
)
def test_local_or_commented_syslog_is_not_forwarding(make_rt: Any, tray: Path, path: str, text: str) -> None:
    """A commented-out remote action, a network source, a local file destination: nothing forwards."""
    _mountinfo(tray, *STATELESS)
    (tray / "run/systemd/system").mkdir(parents=True)
    _put(tray, path, text)
    assert _checks(make_rt(log={"syslog": "yes"}))["imexctl.logs"].status == doctor.WARN


def test_job_that_is_gone_is_stale(make_rt: Any, host: FakeHost) -> None:
    """A job directory of a job that no longer runs here fails, and the fix is imexctl cleanup."""
    rt = make_rt()
    rt.settings.paths.job(41).path.mkdir(parents=True)
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.FAIL and "job 41 (directory)" in check.message
    assert check.fix.startswith("imexctl cleanup")
    host.running_jobs.add(41)
    assert _checks(rt)["imexctl.stale"].status == doctor.OK


def test_set_up_domain_without_a_step_is_not_stale(make_rt: Any, host: FakeHost) -> None:
    """A job whose prolog set up its domain (daemon running) and whose epilog has not run may still run: not stale."""
    rt = make_rt()
    jd = rt.settings.paths.job(42)
    jd.path.mkdir(parents=True)
    state = {"job_id": 42, "node": "gb01", "uid": 1000, "gid": 1000, "user": "u", "nodes": ["gb01"]}
    state |= {"addresses": ["10.0.0.1"], "port": 61042, "backend": "exec", "channel_minor": None}
    state |= {"channel_path": "", "created": 0.0, "cmd_port": 62042, "set_up": 5.0}
    jd.state.write_text(json.dumps(state))
    host.spawn_detached([rt.settings.commands.nvidia_imex, "-c", str(jd.config)], log_path=Path("/dev/null"))
    assert _checks(rt)["imexctl.stale"].status == doctor.OK
    state["ended"] = 9.0  # its epilog began here: the job has ended
    jd.state.write_text(json.dumps(state))
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.FAIL and "job 42 (directory, daemon pid" in check.message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a real character device node")
def test_stray_channel_warns(make_rt: Any) -> None:
    """A channel node that no job claims is a WARN naming its owner."""
    rt = make_rt()
    chan = rt.settings.paths.channel_dir
    chan.mkdir(parents=True)
    os.mknod(chan / "channel9", stat.S_IFCHR | 0o600, os.makedev(234, 9))
    os.chown(chan / "channel9", 1234, 1234)
    check = _checks(rt)["imexctl.channels"]
    assert check.status == doctor.WARN and "channel9 (uid 1234, mode 0600)" in check.message


def test_a_check_that_crashes_is_reported_not_raised(make_rt: Any, host: FakeHost) -> None:
    """An unexpected error inside a check group becomes one FAIL; the other groups still report."""

    def boom(_job_id: int) -> bool:
        raise RuntimeError("psutil exploded")

    host.job_is_running = boom  # type: ignore[method-assign]
    host.running_jobs.add(1)
    rt = make_rt()
    rt.settings.paths.job(3).path.mkdir(parents=True)
    checks = _checks(rt)
    assert checks["imexctl.stale"].status == doctor.FAIL and "psutil exploded" in checks["imexctl.stale"].message
    assert "nvml.fabric" in checks


def _mid_flight(rt: Runtime, host: FakeHost, job_id: int, **marks: float) -> None:
    """What a hook of ``job_id`` has written when it is interrupted: its state (with ``marks``) and its daemon."""
    jd = rt.settings.paths.job(job_id)
    jd.path.mkdir(parents=True)
    state = {"job_id": job_id, "node": "gb01", "uid": 1000, "gid": 1000, "user": "u", "nodes": ["gb01", "gb02"]}
    state |= {"addresses": ["10.0.0.1", "10.0.0.2"], "port": 61000 + job_id, "backend": "exec"}
    state |= {"channel_minor": None, "channel_path": "", "created": 0.0, "cmd_port": 62000 + job_id, **marks}
    jd.state.write_text(json.dumps(state))
    host.spawn_detached([rt.settings.commands.nvidia_imex, "-c", str(jd.config)], log_path=Path("/dev/null"))


@pytest.mark.parametrize(
    "marks",
    [{}, {"set_up": 5.0, "ended": 9.0}],
    ids=["prolog-setting-up", "epilog-begun"],
)
def test_a_hook_in_flight_is_never_a_fail(make_rt: Any, host: FakeHost, marks: dict[str, float]) -> None:
    """A prolog setting up (state before its mark, no slurmstepd yet under PrologFlags=Alloc) or an epilog that
    began: while it holds the node lock, doctor says "in progress" and fails nothing; once the lock is free, the
    same leftovers are stale."""
    from imexctl.hooks.state import node_lock

    rt = make_rt()
    _mid_flight(rt, host, 43, **marks)
    with node_lock(rt.settings.paths.lock_file, host, 1):
        checks = _checks(rt)
        assert checks["imexctl.stale"].status == doctor.OK and "in progress" in checks["imexctl.stale"].message
        assert checks["imexctl.channels"].status == doctor.OK
        assert doctor.exit_code(list(checks.values())) == 0
    # the hook died there (slurmd's timeout, a crash): now it is a fault of the tray
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.FAIL and "job 43 (directory, daemon pid" in check.message


def test_doctor_takes_the_lock_without_waiting_or_writing(make_rt: Any, host: FakeHost) -> None:
    """Doctor never waits for the lock (a held lock costs no time) and never creates the lock file or run_dir."""
    rt = make_rt()
    run_dir = rt.settings.paths.run_dir
    assert not run_dir.exists()
    _checks(rt)
    assert not run_dir.exists() and host.slept == []
    from imexctl.hooks.state import node_lock

    _mid_flight(rt, host, 44)
    with node_lock(rt.settings.paths.lock_file, host, 1):
        before = host.now
        _checks(rt)
        assert host.now == before and host.slept == []


# ---------------------------------------------------------------- nvidia-imex held at the driver's version (issue 35)

DPKG_IMEX = "Package: {name}\nStatus: {state} ok installed\nPriority: optional\nVersion: {version}\nDescription: IMEX\n"


def _dpkg(tray: Path, name: str, state: str, version: str) -> None:
    status = tray / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    other = "Package: bash\nStatus: install ok installed\nVersion: 5.2.15-2\n"
    status.write_text(other + "\n" + DPKG_IMEX.format(name=name, state=state, version=version) + "\n")


@pytest.mark.parametrize(
    ("name", "state", "version", "status", "words"),
    [
        ("nvidia-imex", "hold", "580.95.05-1", "OK", "nvidia-imex 580.95.05-1 is held (apt-mark) at the driver's"),
        ("nvidia-imex-570", "hold", "580.95.05-0ubuntu1", "OK", "nvidia-imex-570 580.95.05-0ubuntu1 is held"),
        ("nvidia-imex", "install", "580.95.05-1", "WARN", "nvidia-imex 580.95.05-1 is not held"),
        ("nvidia-imex", "hold", "580.82.07-1", "FAIL", "held (apt-mark) at 580.82.07-1, but the driver is 580.95.05"),
    ],
)
def test_imex_package_is_held_at_the_drivers_version_dpkg(
    make_rt: Any, tray: Path, name: str, state: str, version: str, status: str, words: str
) -> None:
    """dpkg's status: nvidia-imex (580 on) or nvidia-imex-<branch> held by apt-mark at the driver's version; not
    held WARNs with the apt-mark line for that package; held at another version FAILs."""
    _dpkg(tray, name, state, version)
    check = _checks(make_rt())["imex.held"]
    assert (check.status, words in check.message) == (status, True), check
    if status == "WARN":
        assert check.fix.startswith(f"apt-mark hold {name}")


@pytest.mark.parametrize(
    ("lock", "status", "words"),
    [
        ("nvidia-imex-0:580.95.05-1.el9.*\n", "OK", "nvidia-imex 580.95.05 is locked (dnf versionlock)"),
        ("nvidia-imex-580-580.82.07-1.el9.*\n", "FAIL", "nvidia-imex-580 is locked (dnf versionlock) at 580.82.07"),
        ("", "WARN", "not in dnf's versionlock list"),
    ],
)
def test_imex_package_is_locked_at_the_drivers_version_rpm(
    make_rt: Any, tray: Path, lock: str, status: str, words: str
) -> None:
    """An RPM system: dnf versionlock's list names nvidia-imex at the driver's version."""
    (tray / "var/lib/rpm").mkdir(parents=True)
    if lock:
        (tray / "etc/dnf/plugins").mkdir(parents=True)
        (tray / "etc/dnf/plugins/versionlock.list").write_text("# locks\n" + lock)
    check = _checks(make_rt())["imex.held"]
    assert (check.status, words in check.message) == (status, True), check


def test_imex_held_without_a_package_database_is_not_checked(make_rt: Any, tray: Path) -> None:
    """No dpkg status and no RPM database (binaries copied by hand): nothing to judge, said so."""
    check = _checks(make_rt())["imex.held"]
    assert check.status == doctor.OK and check.message.startswith("not checked")


def test_batch_start_timeout_without_a_prolog_timeout_is_judged_by_the_worst_case(make_rt: Any, tray: Path) -> None:
    """No prolog timeout at all: BatchStartTimeout (default 10 s) is compared with the prolog's worst case."""
    _use_conf(tray, "no-timeout.conf")
    conf = tray / "etc/slurm/slurm.conf"
    conf.write_text(conf.read_text().replace("BatchStartTimeout=120\n", ""))
    check = _checks(make_rt())["slurm.batch_start_timeout"]
    assert (
        check.status == doctor.WARN
        and "BatchStartTimeout=10 (its default) is below the prolog's worst case" in check.message
    )
    assert check.fix == "set BatchStartTimeout=120"


def test_an_epilog_before_its_lock_is_in_flight(make_rt: Any, host: FakeHost) -> None:
    """The epilog marks its job ended before it takes the node lock: with the lock free for that moment, the
    job's daemon is no stale fault until an epilog's longest wait has passed since the mark."""
    rt = make_rt()
    _mid_flight(rt, host, 45, set_up=5.0, ended=host.time() - 2)
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.OK and "in progress" in check.message
    host.now += 120
    assert _checks(rt)["imexctl.stale"].status == doctor.FAIL


# ---------------------------------------------------------------- imexctl.stale by the epilog's deadline and the one liveness rule (issue 41)


def test_an_epilog_is_in_flight_until_the_deadline_it_recorded(make_rt: Any, host: FakeHost) -> None:
    """The epilog records its own deadline with its mark (every wait it makes, with the settings it read, a long
    process_wait_s among them): until then its job's daemon is no stale fault, whatever today's settings sum to."""
    rt = make_rt()
    _mid_flight(rt, host, 45, set_up=5.0, ended=host.time() - 2, epilog_deadline=host.time() + 300)
    host.now += 120  # past today's settings' window (process_wait_s 20 + lock 30 + stop 1 + kill 1 + 10 s)
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.OK and "in progress" in check.message
    host.now += 181
    assert _checks(rt)["imexctl.stale"].status == doctor.FAIL


def test_a_gone_jobs_daemon_out_of_procs_sight_is_named_by_its_backend(make_rt: Any, host: FakeHost) -> None:
    """Job 47 ended long ago; its daemon's program moved under it, so /proc no longer shows it as [commands]
    nvidia_imex, but the exec backend's pid file names it alive: the FAIL names that daemon, not just the
    directory."""
    rt = make_rt()
    _mid_flight(rt, host, 47, set_up=5.0, ended=9.0)
    proc = host.procs[max(host.procs)]
    rt.settings.paths.job(47).pid_file.write_text(f"{proc.info.pid} {proc.info.create_time!r}\n")
    proc.info = proc.info._replace(exe="/usr/lib/nvidia/580/nvidia-imex")
    check = _checks(rt)["imexctl.stale"]
    assert check.status == doctor.FAIL, check
    assert (
        f"job 47 (directory, daemon (pid {proc.info.pid}: its exec backend says it runs, /proc does not show it as "
        "[commands] nvidia_imex))" in check.message
    ), check.message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a real character device node")
def test_channels_a_running_jobs_unreadable_state_may_claim_are_not_called_unclaimed(
    make_rt: Any, host: FakeHost
) -> None:
    """Job 46 runs here and its state.json cannot be read: it may claim any channel but channel0, so channel9 is
    no channel 'that no job claims', and cleanup leaves it while that lasts: the WARN says so, naming the job."""
    rt = make_rt()
    _mid_flight(rt, host, 46, set_up=5.0)
    host.running_jobs.add(46)
    rt.settings.paths.job(46).state.write_text('{"job_id": 4')
    chan = rt.settings.paths.channel_dir
    chan.mkdir(parents=True)
    os.mknod(chan / "channel9", stat.S_IFCHR | 0o600, os.makedev(234, 9))
    check = _checks(rt)["imexctl.channels"]
    assert check.status == doctor.WARN, check
    assert check.message == (
        "channel nodes that no readable state claims: channel9 (uid 0, mode 0600); the state of job 46 cannot be "
        "read, and it may claim any of them"
    ), check.message
    assert "cleanup leaves them" in check.fix and "job 46" in check.fix, check.fix
