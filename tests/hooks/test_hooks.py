"""hooks/ and systemd/: logic-free files, run as slurmd runs them (no PATH) against a stub imexctl."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ci import need_tools

REPO = Path(__file__).resolve().parents[2]
HOOKS = ("prolog", "epilog")
INSTALLED = "/opt/imexctl/bin/imexctl"


@pytest.fixture
def shellcheck() -> None:
    need_tools("shellcheck")


@pytest.fixture
def systemd_analyze() -> None:
    need_tools("systemd-analyze", how="Debian's systemd; bash .ci/setup test installs it")


# The stub reads its environment from /proc/self/environ: Python itself adds LC_CTYPE at
# start-up (PEP 538), which would hide what the hook really passed on.
STUB = """#!{python}
import json, os, sys
raw = open("/proc/self/environ", "rb").read().split(b"\\0")
env = dict(kv.decode().split("=", 1) for kv in raw if kv)
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv, "env": env}}, f)
sys.stderr.write("stub stderr\\n")
sys.exit(int(open({code!r}).read()))
"""


def install_copy(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """Copy hook ``name`` into tmp_path with imexctl's path pointing at a recording stub."""
    stub, record, code = tmp_path / "imexctl", tmp_path / "record.json", tmp_path / "code"
    stub.write_text(STUB.format(python=sys.executable, record=str(record), code=str(code)))
    stub.chmod(0o755)
    code.write_text("0")
    text = (REPO / "hooks" / name).read_text()
    assert INSTALLED in text
    hook = tmp_path / name
    hook.write_text(text.replace(INSTALLED, str(stub)))
    hook.chmod(0o755)
    return hook, record, code


def run_hook(hook: Path, env: dict[str, str]) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([str(hook)], env=env, cwd="/", capture_output=True, text=True, timeout=30, check=False)


def recorded(record: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(record.read_text())
    return data


@pytest.mark.parametrize("name", HOOKS)
class TestHookScripts:
    def test_runs_imexctl_with_exactly_its_subcommand(self, tmp_path: Path, name: str) -> None:
        """Run without any environment (no PATH), the hook execs imexctl with only its subcommand."""
        hook, record, _ = install_copy(tmp_path, name)
        done = run_hook(hook, env={})
        assert done.returncode == 0, done.stderr
        data = recorded(record)
        assert data["argv"] == [str(tmp_path / "imexctl"), name]
        assert "PATH" not in data["env"]  # type: ignore[operator]

    def test_passes_slurm_environment_unchanged(self, tmp_path: Path, name: str) -> None:
        """slurmd's variables reach imexctl exactly as given; the shell adds at most PWD."""
        hook, record, _ = install_copy(tmp_path, name)
        env = {
            "SLURM_JOB_ID": "42",
            "SLURMD_NODENAME": "gb01",
            "SLURM_JOB_NODELIST": "gb[01-02]",
            "SLURM_SCRIPT_CONTEXT": f"{name}_slurmd",
            "ODD": "a b\tc'\"$x",
        }
        assert run_hook(hook, env=env).returncode == 0
        got = dict(recorded(record)["env"])  # type: ignore[call-overload]
        got.pop("PWD", None)
        assert got == env

    @pytest.mark.parametrize("code", [1, 65, 75, 78])
    def test_exit_code_propagates(self, tmp_path: Path, name: str, code: int) -> None:
        """imexctl's exit code is the hook's exit code (slurmd drains on non-zero)."""
        hook, _, code_file = install_copy(tmp_path, name)
        code_file.write_text(str(code))
        done = run_hook(hook, env={})
        assert done.returncode == code
        assert done.stderr == "stub stderr\n"

    def test_exec_replaces_the_shell(self, tmp_path: Path, name: str) -> None:
        """The hook execs imexctl, so imexctl's pid is the hook's pid (slurmd signals the right process)."""
        hook, record, _ = install_copy(tmp_path, name)
        stub = tmp_path / "imexctl"
        stub.write_text(stub.read_text().replace('"argv": sys.argv', '"argv": sys.argv, "pid": os.getpid()'))
        proc = subprocess.Popen([str(hook)], env={}, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert proc.wait(timeout=30) == 0
        assert recorded(record)["pid"] == proc.pid

    def test_contains_only_absolute_paths_and_exec(self, name: str) -> None:
        """Besides comments the hook is one 'exec /absolute/imexctl <name>' line under an absolute shebang."""
        path = REPO / "hooks" / name
        lines = path.read_text().splitlines()
        assert lines[0].startswith("#!/") and " " not in lines[0].strip()
        code = [ln.strip() for ln in lines[1:] if ln.strip() and not ln.lstrip().startswith("#")]
        assert code == [f"exec {INSTALLED} {name}"]
        assert os.access(path, os.X_OK)


@pytest.mark.usefixtures("shellcheck")
@pytest.mark.parametrize("name", HOOKS)
def test_shellcheck_is_clean(name: str) -> None:
    """shellcheck finds nothing in the hook."""
    done = subprocess.run(
        ["shellcheck", "--shell=sh", str(REPO / "hooks" / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# nvidia-imex is not installed where the tests run; every other finding fails the test.
_EXPECTED_WARNING = "Command /usr/bin/nvidia-imex is not executable"


def _verify_findings(unit: Path) -> list[str]:
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return [ln for ln in lines if _EXPECTED_WARNING not in ln]


IMEX_UNIT = REPO / "systemd" / "imexctl-imex@.service"
#: the sandbox of the daemon's unit; each option's reason is in docs/security.md
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectHostname": "yes",
    "SystemCallFilter": "~@clock",
    "SystemCallErrorNumber": "EPERM",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
}
#: options that would hide or deny what the real daemon uses (ProtectClock= implies DeviceAllow=char-rtc,
#: which makes the device list an allow list without /dev/nvidia*)
HIDING = (
    "PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectKernelTunables", "ProtectProc",
    "ProcSubset", "InaccessiblePaths", "TemporaryFileSystem", "PrivateNetwork", "IPAddressDeny", "RootDirectory",
    "PrivateUsers", "DynamicUser", "User", "ReadOnlyPaths",
)  # fmt: skip


def _exposure(root: Path, unit: str, dropin: str | None = None) -> float:
    """The overall exposure systemd-analyze security --offline gives the unit (with a drop-in) under root."""
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / IMEX_UNIT.name).write_text(unit)
    if dropin is not None:
        (units / f"{IMEX_UNIT.name}.d").mkdir()
        (units / f"{IMEX_UNIT.name}.d/no-hardening.conf").write_text(dropin)
    argv = ["systemd-analyze", "security", "--offline=yes", f"--root={root}", "--no-pager", IMEX_UNIT.name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    assert found, done.stdout + done.stderr
    assert "Unknown key" not in done.stderr and "Failed to parse" not in done.stderr, done.stderr
    return float(found.group(1))


@pytest.mark.usefixtures("systemd_analyze")
class TestSystemdUnit:
    def test_unit_verifies(self, tmp_path: Path) -> None:
        """systemd-analyze verify reports nothing but the missing nvidia-imex binary."""
        unit = tmp_path / "imexctl-imex@42.service"
        shutil.copy(REPO / "systemd" / "imexctl-imex@.service", unit)
        assert _verify_findings(unit) == []

    def test_verify_catches_a_bad_key(self, tmp_path: Path) -> None:
        """The verify check is able to fail: an unknown key is reported."""
        unit = tmp_path / "imexctl-imex@42.service"
        unit.write_text((REPO / "systemd" / "imexctl-imex@.service").read_text() + "Bogus=1\n")
        assert any("Bogus" in ln for ln in _verify_findings(unit))

    def test_unit_is_sandboxed(self) -> None:
        """The unit sets each hardening option of docs/security.md, and names its documentation."""
        keys = _unit_keys(IMEX_UNIT)
        assert {key: keys.get(key) for key in HARDENING} == {key: [value] for key, value in HARDENING.items()}
        assert keys["Documentation"]
        security = (REPO / "docs/security.md").read_text()
        assert not [key for key in HARDENING if f"| `{key}=" not in security], "each option has its reason there"
        dropin = _unit_keys(REPO / "systemd/no-hardening.conf")
        assert set(dropin) == set(HARDENING), "the drop-in resets every option"

    def test_sandbox_hides_nothing_the_daemon_needs(self) -> None:
        """No option that hides or blocks /dev/nvidia*, /proc/driver/nvidia, /run or /dev's channel directory,
        or the daemon's network."""
        keys = _unit_keys(IMEX_UNIT)
        assert not [key for key in HIDING if key in keys]
        assert keys.get("ProtectSystem", ["no"]) in (["no"], ["yes"], ["full"])  # never strict: /run, /var
        assert set(keys["RestrictAddressFamilies"][0].split()) >= {"AF_INET", "AF_INET6", "AF_UNIX"}

    def test_security_exposure_is_at_most_7_5(self, tmp_path: Path) -> None:
        """systemd-analyze security rates the unit 7.5 or better (it was 9.6 without the sandbox)."""
        assert _exposure(tmp_path, IMEX_UNIT.read_text()) <= 7.5

    def test_no_hardening_drop_in_undoes_the_sandbox(self, tmp_path: Path) -> None:
        """With systemd/no-hardening.conf as a drop-in, the unit is rated as if it had none of the options."""
        bare = "".join(
            ln for ln in IMEX_UNIT.read_text().splitlines(keepends=True) if ln.split("=")[0] not in HARDENING
        )
        dropin = (REPO / "systemd" / "no-hardening.conf").read_text()
        assert _exposure(tmp_path / "a", IMEX_UNIT.read_text(), dropin) == _exposure(tmp_path / "b", bare) > 9

    def test_exec_start_matches_imexctl_defaults(self) -> None:
        """ExecStart runs the default nvidia-imex with the per-job config that imexctl writes."""
        text = (REPO / "systemd" / "imexctl-imex@.service").read_text()
        assert "ExecStart=/usr/bin/nvidia-imex -c /run/imexctl/jobs/%i/config.cfg\n" in text
        assert "Type=simple\n" in text and "Restart=no\n" in text


# ---------------------------------------------------------------- boot-time cleanup unit

CLEANUP_UNIT = REPO / "systemd" / "imexctl-cleanup.service"


def _unit_keys(path: Path) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


class TestBootCleanupUnit:
    def test_runs_once_per_boot_before_slurmd(self) -> None:
        """A oneshot that stays 'active' after it ran (so a slurmd restart does not run it again),
        ordered before slurmd and pulled in by it, running the installed imexctl's cleanup."""
        keys = _unit_keys(CLEANUP_UNIT)
        assert keys["Type"] == ["oneshot"] and keys["RemainAfterExit"] == ["yes"]
        assert keys["Before"] == ["slurmd.service"] and "slurmd.service" in keys["WantedBy"]
        assert keys["ExecStart"] == [f"{INSTALLED} cleanup"]
        assert "Requires" not in keys and "RequiredBy" not in keys  # a failed cleanup never blocks slurmd

    @pytest.mark.usefixtures("systemd_analyze")
    def test_unit_verifies(self, tmp_path: Path) -> None:
        """systemd-analyze verify reports nothing but what this machine lacks (slurmd, the installed imexctl)."""
        unit = tmp_path / "imexctl-cleanup.service"
        shutil.copy(CLEANUP_UNIT, unit)
        done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        findings = [ln for ln in (done.stdout + done.stderr).splitlines()
                    if ln.strip() and "slurmd.service" not in ln and INSTALLED not in ln]  # fmt: skip
        assert findings == []

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root: imexctl cleanup runs as root")
    def test_exec_start_leaves_a_crashed_tray_clean(self, tmp_path: Path) -> None:
        """What ExecStart runs, after a crash mid-job: a job directory, a channel node of that job and its
        daemon (a process still pointing at the job's config) are all removed, and it exits 0."""
        root = tmp_path / "root"
        job = root / "run/imexctl/jobs/4711"
        job.mkdir(parents=True)
        (root / "proc").mkdir()
        (root / "proc/devices").write_text("Character devices:\n234 nvidia-caps-imex-channels\nBlock devices:\n")
        chan_dir = root / "dev/nvidia-caps-imex-channels"
        chan_dir.mkdir(parents=True)
        os.mknod(chan_dir / "channel7", 0o20600, os.makedev(234, 7))
        (job / "config.cfg").write_text("SERVER_PORT=61711\n")
        imex = tmp_path / "nvidia-imex"  # the configured daemon program: only it counts as a daemon
        imex.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
        imex.chmod(0o755)
        daemon = subprocess.Popen([str(imex), "-c", str(job / "config.cfg")])
        conf = tmp_path / "imexctl.conf"
        conf.write_text(
            f"[paths]\nroot = {root}\nlog_file =\n[daemon]\nbackend = exec\nkill_grace_s = 2\n"
            f"[commands]\nnvidia_imex = {imex}\n"
        )
        conf.chmod(0o644)
        argv = _unit_keys(CLEANUP_UNIT)["ExecStart"][0].split()
        argv[0] = sys.executable + " -m imexctl" if not Path(argv[0]).exists() else argv[0]
        env = {"IMEXCTL_CONFIG": str(conf), "PYTHONPATH": str(REPO), "SLURMD_NODENAME": "tray01"}
        try:
            done = subprocess.run([*argv[0].split(), *argv[1:]], env=env, capture_output=True, text=True,
                                  timeout=60, check=False)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            assert daemon.wait(timeout=10) is not None
        finally:
            daemon.kill()
        assert not job.exists() and list(chan_dir.iterdir()) == []
        assert "job 4711" in done.stdout and "channel7" in done.stdout


# ---------------------------------------------------------------- the live-gauge timer

METRICS_SERVICE = REPO / "systemd" / "imexctl-metrics.service"
METRICS_TIMER = REPO / "systemd" / "imexctl-metrics.timer"


def _seconds(text: str) -> float:
    """A systemd time span as written in a unit (``15s``, ``1min``, ``500ms``), in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60}
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    return float(number) * units[text[len(number) :] or "s"]


class TestLiveGaugeUnits:
    def test_service_refreshes_the_live_file_once(self) -> None:
        """A oneshot running the installed imexctl's status --textfile, never enabled by itself (no [Install]):
        the timer starts it."""
        keys = _unit_keys(METRICS_SERVICE)
        assert keys["Type"] == ["oneshot"] and keys["ExecStart"] == [f"{INSTALLED} status --textfile"]
        assert "WantedBy" not in keys and "RemainAfterExit" not in keys
        assert _seconds(keys["TimeoutStartSec"][0]) >= 30  # above [readiness] ctl_timeout_s's default of 5 s

    def test_timer_counts_a_lost_daemon_within_a_minute(self) -> None:
        """Every 15 s, first right after it starts, to the second (not systemd's default accuracy of one minute);
        enabled into timers.target by the one line of docs/metrics.md."""
        keys = _unit_keys(METRICS_TIMER)
        assert _seconds(keys["OnUnitActiveSec"][0]) <= 15 and _seconds(keys["OnActiveSec"][0]) <= 1
        assert _seconds(keys["AccuracySec"][0]) <= 1
        assert keys["WantedBy"] == ["timers.target"] and "Unit" not in keys  # the service of its own name
        page = (REPO / "docs/metrics.md").read_text()
        assert "systemctl enable --now imexctl-metrics.timer" in page

    @pytest.mark.usefixtures("systemd_analyze")
    @pytest.mark.parametrize("unit", [METRICS_SERVICE, METRICS_TIMER], ids=lambda p: p.name)
    def test_units_verify(self, unit: Path, tmp_path: Path) -> None:
        """systemd-analyze verify reports nothing but the installed imexctl this machine lacks."""
        for path in (METRICS_SERVICE, METRICS_TIMER):
            shutil.copy(path, tmp_path / path.name)
        findings = [ln for ln in _verify_all(tmp_path / unit.name) if INSTALLED not in ln]
        assert findings == []

    @pytest.mark.usefixtures("systemd_analyze")
    def test_verify_catches_a_bad_timer_key(self, tmp_path: Path) -> None:
        """The verify check is able to fail: an unknown key of the timer is reported."""
        shutil.copy(METRICS_SERVICE, tmp_path / METRICS_SERVICE.name)
        (tmp_path / METRICS_TIMER.name).write_text(METRICS_TIMER.read_text().replace("[Install]", "Bogus=1\n[Install]"))
        assert any("Bogus" in ln for ln in _verify_all(tmp_path / METRICS_TIMER.name))


def _verify_all(unit: Path) -> list[str]:
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    return [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
