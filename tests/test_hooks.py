"""hooks/ and systemd/: logic-free files, run as slurmd runs them (no PATH) against a stub imexctl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOOKS = ("prolog", "epilog")
INSTALLED = "/opt/imexctl/bin/imexctl"

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


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
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


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
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

    def test_exec_start_matches_imexctl_defaults(self) -> None:
        """ExecStart runs the default nvidia-imex with the per-job config that imexctl writes."""
        text = (REPO / "systemd" / "imexctl-imex@.service").read_text()
        assert "ExecStart=/usr/bin/nvidia-imex -c /run/imexctl/jobs/%i/config.cfg\n" in text
        assert "Type=simple\n" in text and "Restart=no\n" in text
