"""cli: ``imexctl.cli.main`` in-process over the fakes: exit codes, output and the JSON envelope."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl import slurm
from imexctl.cli import main
from imexctl.config import schema
from imexctl.config.paths import JobDir
from imexctl.config.settings import Settings
from imexctl.hooks.state import mark_state
from imexctl.platform.errors import ExitCode
from tests.support.fakes import FakeGpu, FakeHost, job_env
from tests.support.privileges import needs_mknod


@pytest.fixture
def cfg(make_settings: Callable[..., Settings]) -> str:
    """The path of a valid config under the test root (exec backend, 5 s deadline)."""
    return str(make_settings().source)


def run(cfg: str, *argv: str, host: FakeHost, gpu: Any = None, env: dict[str, str] | None = None) -> int:
    return main(
        ["--config", cfg, *argv],
        env=job_env() if env is None else env,
        host=host,
        gpu=FakeGpu() if gpu is None else gpu,
    )


def ended_here(root: Path, job_id: int) -> None:
    """What an epilog killed after taking the node lock leaves: the job's state marked ended."""
    assert mark_state(JobDir(job_id, root / f"run/imexctl/jobs/{job_id}"), ended=1.0)


def envelope(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert set(out) == {"imexctl_result_version", "status", "exit_code", "data", "errors"}
    assert out["imexctl_result_version"] == "1"
    return out


class TestHostlist:
    def test_expand(self, capsys: pytest.CaptureFixture[str]) -> None:
        """hostlist expand prints one host per line for every expression, in order."""
        assert main(["hostlist", "expand", "gb[01-03]", "x1"]) == 0
        assert capsys.readouterr().out == "gb01\ngb02\ngb03\nx1\n"

    def test_fold_arguments(self, capsys: pytest.CaptureFixture[str]) -> None:
        """hostlist fold prints the compressed list of its arguments, keeping order."""
        assert main(["hostlist", "fold", "gb03", "gb01", "gb02"]) == 0
        assert capsys.readouterr().out == "gb[03,01-02]\n"

    def test_fold_stdin(self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        """Without arguments hostlist fold reads blank-separated names from stdin."""
        monkeypatch.setattr("sys.stdin", io.StringIO("gb01 gb02\ngb03\n"))
        assert main(["hostlist", "fold"]) == 0
        assert capsys.readouterr().out == "gb[01-03]\n"

    def test_fold_empty_stdin_prints_nothing(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Empty stdin folds to no output and success."""
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        assert main(["hostlist", "fold"]) == 0
        assert capsys.readouterr().out == ""

    def test_bad_node_list_exits_65_with_message(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A malformed expression exits 65 and stderr names the faulty part in one plain line; stdout stays empty."""
        assert main(["hostlist", "expand", "gb01", "gb[01-"]) == 65
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            "imexctl hostlist expand: invalid node list: '[' without ']': 'gb[01-' in 'gb[01-' "
            "(nodelist_invalid, exit 65)\n"
        )

    def test_bad_node_list_with_v_is_the_structured_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        """-v asks for the log lines on stderr: the failure is then the structured imexctl.failed line alone."""
        assert main(["-v", "hostlist", "expand", "gb[01-"]) == 65
        (line,) = [json.loads(ln) for ln in capsys.readouterr().err.splitlines()]
        assert (line["event"], line["error_code"], line["exit_code"]) == ("imexctl.failed", "nodelist_invalid", 65)
        assert "'gb[01-'" in line["reason"]


class TestHooks:
    def test_prolog_success_exits_0(self, cfg: str, host: FakeHost, root: Path) -> None:
        """A working prolog exits 0 and leaves the job's files."""
        assert run(cfg, "prolog", host=host) == 0
        assert (root / "run/imexctl/jobs/42/nodes_config.cfg").read_text() == "10.0.0.1\n10.0.0.2\n"

    def test_epilog_after_prolog_exits_0_and_cleans(self, cfg: str, host: FakeHost, root: Path) -> None:
        """The epilog after a prolog exits 0 and removes the job directory."""
        assert run(cfg, "prolog", host=host) == 0
        assert run(cfg, "epilog", host=host) == 0
        assert not (root / "run/imexctl/jobs/42").exists()

    def test_health_timeout_exits_75(self, cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """A daemon that is never ready makes the prolog exit 75 (TEMPFAIL)."""
        host.ready_after = 10**6
        assert run(cfg, "prolog", host=host) == ExitCode.TEMPFAIL == 75
        assert '"error_code": "not_ready"' in capsys.readouterr().err

    def test_config_error_exits_78(self, root: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """An invalid config file makes the prolog exit 78 and names the bad key."""
        bad = root / "bad.conf"
        bad.write_text("[readiness]\ndeadline = 5\n")
        assert run(str(bad), "prolog", host=host) == ExitCode.CONFIG == 78
        assert "[readiness] deadline: unknown key" in capsys.readouterr().err
        assert host.calls == []

    def test_missing_explicit_config_exits_78(self, root: Path, host: FakeHost) -> None:
        """A --config that does not exist exits 78."""
        assert run(str(root / "nope.conf"), "prolog", host=host) == 78

    @pytest.mark.parametrize("command", ["prolog", "epilog", "cleanup"])
    def test_not_root_exits_77(self, cfg: str, host: FakeHost, command: str, root: Path) -> None:
        """Hooks and cleanup refuse to run without root and change nothing."""
        host.euid_value = 1000
        assert run(cfg, command, host=host) == ExitCode.NOPERM == 77
        assert host.calls == [] and not (root / "run/imexctl/jobs").exists()

    def test_bad_job_environment_exits_65(self, cfg: str, host: FakeHost) -> None:
        """A malformed SLURM_JOB_ID exits 65."""
        assert run(cfg, "prolog", host=host, env=job_env(SLURM_JOB_ID="x")) == 65

    def test_busy_node_exits_69(self, cfg: str, host: FakeHost) -> None:
        """A node whose domain belongs to another job exits 69 for the second job."""
        assert run(cfg, "prolog", host=host, env=job_env(job_id=7)) == 0
        assert run(cfg, "prolog", host=host, env=job_env(job_id=8)) == ExitCode.UNAVAILABLE == 69

    def test_unexpected_exception_exits_70_with_trace(
        self, cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An exception imexctl does not expect exits 70 and logs imexctl.crashed with the traceback."""
        assert run(cfg, "prolog", host=host, gpu=FakeGpu(error=RuntimeError("boom"))) == ExitCode.SOFTWARE == 70
        err = capsys.readouterr().err
        assert '"event": "imexctl.crashed"' in err and "RuntimeError: boom" in err
        # the hook logs without structlog until it crashes: the trace line still carries the hook's context
        (crashed,) = [json.loads(ln) for ln in err.splitlines() if '"imexctl.crashed"' in ln]
        assert (crashed["hook"], crashed["job_id"], crashed["node"], crashed["level"]) == (
            "prolog",
            42,
            "gb01",
            "error",
        )

    def test_keyboard_interrupt_exits_130(self, cfg: str, host: FakeHost) -> None:
        """An interrupted command exits 128 + SIGINT."""
        assert run(cfg, "prolog", host=host, gpu=FakeGpu(error=KeyboardInterrupt())) == 130  # type: ignore[arg-type]

    def test_skipped_job_exits_0(self, cfg: str, host: FakeHost) -> None:
        """A one-tray job on a tray without NVLink fabric is skipped with exit 0, touching nothing."""
        env = job_env(nodelist="gb01")
        assert run(cfg, "prolog", host=host, gpu=FakeGpu(infos=[None, None]), env=env) == 0
        assert host.calls == []

    def test_tray_without_fabric_in_a_two_tray_job_fails_itself(self, cfg: str, host: FakeHost) -> None:
        """The same tray in a two-tray job: exit 69 (gpu_failed), so Slurm drains it and not its peer."""
        assert run(cfg, "prolog", host=host, gpu=FakeGpu(infos=[None, None])) == 69
        assert host.calls == []


class TestStatus:
    def test_json_after_prolog_running_job(
        self, cfg: str, real_nodes: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """status --json after a prolog shows the job, its channel and nothing stale while the job runs."""
        host = real_nodes
        assert run(cfg, "prolog", host=host) == 0
        host.running_jobs.add(42)
        capsys.readouterr()
        assert run(cfg, "status", "--json", host=host) == 0
        out = envelope(capsys)
        assert (out["status"], out["exit_code"], out["errors"]) == ("ok", 0, [])
        data = out["data"]
        assert data["node"] == "gb01" and data["owner_job"] == 42 and data["stale"] == []
        (job,) = data["jobs"]
        assert job["job_id"] == 42 and job["running"] is True and job["trays"] == ["gb01", "gb02"]
        assert job["port"] == 61042 and job["daemon"]["state"] == "running"
        assert job["nodes_config"] == ["10.0.0.1", "10.0.0.2"] and job["domain"]["status"] == "UP"
        chan = str(root / "dev/nvidia-caps-imex-channels/channel43")
        assert [(c["path"], c["minor"], c["mode"], c["stale"]) for c in data["channels"]] == [(chan, 43, "0600", False)]

    def test_json_lists_stale_job(
        self, cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A set-up job without a step still counts as running; once its epilog ran here it is stale."""
        assert run(cfg, "prolog", host=host) == 0
        capsys.readouterr()
        assert run(cfg, "status", "--json", host=host) == 0
        assert envelope(capsys)["data"]["stale"] == []
        ended_here(root, 42)
        assert run(cfg, "status", "--json", host=host) == 0
        assert envelope(capsys)["data"]["stale"] == ["job 42: job no longer runs on this node"]

    @needs_mknod
    def test_json_lists_stray_channel(
        self, cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A channel node no job claims is reported as stale."""
        chan_dir = root / "dev/nvidia-caps-imex-channels"
        chan_dir.mkdir(parents=True)
        os.mknod(chan_dir / "channel9", stat.S_IFCHR | 0o600, os.makedev(234, 9))
        assert run(cfg, "status", "--json", host=host) == 0
        data = envelope(capsys)["data"]
        assert data["jobs"] == [] and data["stale"] == [f"channel {chan_dir}/channel9: not owned by any job"]

    def test_text_without_domain(self, cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """status without --json says in words that there is no domain and nothing is stale."""
        assert run(cfg, "status", host=host) == 0
        out = capsys.readouterr().out
        assert "no IMEX domain on this node" in out and "stale: nothing" in out

    @pytest.mark.skipif(os.geteuid() != 0, reason="a command opens [paths] log_file only as root")
    def test_failure_is_one_plain_line_and_a_structured_one_in_the_log_file(
        self, root: Path, host: FakeHost, make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An admin's command that fails says so on stderr in one plain line (no JSON record); the log file
        still gets the structured imexctl.failed line."""
        log_file = root / "var/log/imexctl.log"
        cfg = make_settings(paths={"log_file": "/var/log/imexctl.log"})  # under [paths] root
        host.euid_value = 1000  # cleanup refuses it after its log is set up
        assert run(str(cfg.source), "cleanup", host=host) == 77
        err = capsys.readouterr().err
        assert err == "imexctl cleanup: imexctl cleanup must run as root (not_root, exit 77)\n"
        logged = [json.loads(ln) for ln in log_file.read_text().splitlines()]
        assert [(ln["event"], ln["error_code"], ln["hook"]) for ln in logged] == [
            ("imexctl.failed", "not_root", "cleanup")
        ]

    def test_json_error_envelope(self, root: Path, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """A failing status --json still prints the envelope, with the error and its exit code."""
        bad = root / "bad.conf"
        bad.write_text("[nope]\n")
        assert run(str(bad), "status", "--json", host=host) == 78
        out = envelope(capsys)
        assert (out["status"], out["exit_code"], out["data"]) == ("error", 78, None)
        assert out["errors"][0]["code"] == "config_invalid" and "[nope]" in out["errors"][0]["message"]


class TestCleanup:
    def test_dry_run_json_reports_and_changes_nothing(
        self, cfg: str, host: FakeHost, root: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """cleanup --dry-run --json lists what it would do for a dead job and does none of it."""
        host.real_nodes = False  # the same list as root and as another user: no channel node
        assert run(cfg, "prolog", host=host) == 0
        ended_here(root, 42)
        capsys.readouterr()
        before = sorted(p.name for p in (root / "run/imexctl/jobs/42").iterdir())
        assert run(cfg, "cleanup", "--dry-run", "--json", host=host) == 0
        data = envelope(capsys)["data"]
        assert data["dry_run"] is True and data["errors"] == [] and data["skipped"] == []
        # the fake host makes no device node: daemon and job directory are all there is
        named = ["stop daemon of job 42", f"remove {root}/run/imexctl/jobs/42"]
        assert data["actions"] == [f"would {a}" for a in named]
        assert sorted(p.name for p in (root / "run/imexctl/jobs/42").iterdir()) == before
        assert [p for p in host.procs.values() if p.alive]
        assert run(cfg, "cleanup", "--json", host=host) == 0
        assert envelope(capsys)["data"]["actions"] == named

    def test_running_job_is_skipped(self, cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """cleanup leaves a job that still runs here and says so."""
        assert run(cfg, "prolog", host=host) == 0
        host.running_jobs.add(42)
        capsys.readouterr()
        assert run(cfg, "cleanup", "--json", host=host) == 0
        data = envelope(capsys)["data"]
        assert data["actions"] == [] and data["skipped"] == ["job 42 still runs on this node (use --force)"]

    def test_text_output_when_nothing_to_do(self, cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
        """cleanup on a clean node says there is nothing to clean up."""
        assert run(cfg, "cleanup", host=host) == 0
        assert capsys.readouterr().out == "nothing to clean up\n"


HELP: list[list[str]] = [
    [],
    ["prolog"],
    ["epilog"],
    ["status"],
    ["cleanup"],
    ["hostlist"],
    ["hostlist", "expand"],
    ["hostlist", "fold"],
    ["demo"],
]


@pytest.mark.parametrize("argv", [pytest.param(a, id=" ".join(a) or "top") for a in HELP])
def test_help_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--help of every command prints its usage and exits 0."""
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: imexctl" + "".join(f" {a}" for a in argv))


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown subcommand is refused by argparse with exit 64 (EX_USAGE)."""
    with pytest.raises(SystemExit) as info:
        main(["prologue"])
    assert info.value.code == 64 and "invalid choice" in capsys.readouterr().err


PLAIN_HOOK_LINES = [
    ["prolog"],
    ["epilog"],
    ["--config", "/etc/x.conf", "prolog"],
    ["--config=/etc/x.conf", "-v", "epilog"],
    ["--verbose", "--config", "/etc/x.conf", "-v", "prolog"],
]


@pytest.mark.parametrize("argv", [pytest.param(a, id=" ".join(a)) for a in PLAIN_HOOK_LINES])
def test_plain_hook_line_parses_as_argparse_does(argv: list[str]) -> None:
    """A plain hook line skips the parser (7 ms) and gets the very attributes argparse gives it."""
    from imexctl.cli.dispatch import parse as _parse
    from imexctl.cli.parser import build_parser

    assert vars(_parse(argv)) == vars(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv", [["--conf", "/etc/x.conf", "prolog"], ["prolog", "-v"], ["--config", "-x", "prolog"], ["status"]]
)
def test_other_lines_go_to_argparse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """What is not a plain hook line (an abbreviated option, an option after the command, ...) is argparse's to read."""
    from imexctl.cli.dispatch import parse as _parse
    from imexctl.cli.parser import build_parser

    try:
        expected: dict[str, Any] | int = vars(build_parser().parse_args(argv))
    except SystemExit as exc:
        expected = int(exc.code or 0)
    try:
        got: dict[str, Any] | int = vars(_parse(argv))
    except SystemExit as exc:
        got = int(exc.code or 0)
    assert got == expected
    capsys.readouterr()


def test_plain_hook_line_does_not_import_argparse() -> None:
    """Parsing ``--config FILE prolog`` leaves argparse unimported."""
    import subprocess
    import sys

    code = "import sys, imexctl.cli.dispatch as c; a = c.parse(['--config', '/x', 'prolog']); print(a.command, 'argparse' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["prolog", "False"]


def test_hook_path_imports_no_demo_simulator_or_test_code() -> None:
    """A prolog, an epilog, status and cleanup import neither imexctl.commands.demo, imexctl.sim nor tests/."""
    import subprocess
    import sys

    code = (
        "import sys, imexctl.cli, imexctl.hooks.prolog, imexctl.hooks.teardown, imexctl.commands.status;"
        "bad = [m for m in sys.modules if m.startswith(('imexctl.commands.demo', 'imexctl.sim', 'tests'))];"
        "print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_demo_without_the_simulator_says_so(tmp_path: Path) -> None:
    """In a package without imexctl/sim and imexctl/commands/demo.py (the .deb, the .rpm), demo exits 69 and says why."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(
        Path(__file__).resolve().parents[2] / "imexctl",
        tmp_path / "imexctl",
        ignore=shutil.ignore_patterns("sim", "demo.py", "__pycache__"),
    )
    code = "import sys; from imexctl.cli import main; sys.exit(main(['demo']))"
    # -S: no site-packages, so no editable install's finder that would import the checkout's imexctl
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-S", "-c", code]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert (done.returncode, done.stdout) == (69, "")
    assert done.stderr.startswith("imexctl demo: the simulator is not installed here")


class TestConfigAsTheHooksReadIt:
    """Issue 23: in a root shell without SLURM_CONF, status and doctor read the file slurmd's hooks read."""

    def _site(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
        etc = tmp_path / "etc/slurm"
        etc.mkdir(parents=True)
        (etc / "slurm.conf").write_text("ClusterName=x\n")
        beside = etc / "imexctl.conf"
        beside.write_text(text)
        os.chmod(beside, 0o644)
        monkeypatch.setattr(
            slurm, "SLURMD_CONFS", (str(tmp_path / "run/slurm/conf/slurm.conf"), str(etc / "slurm.conf"))
        )
        monkeypatch.setattr(schema, "DEFAULT_CONFIG", str(tmp_path / "etc/imexctl/imexctl.conf"))
        return beside

    def test_status_reads_the_file_beside_slurm_conf_and_names_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: FakeHost, capsys: pytest.CaptureFixture[str]
    ) -> None:
        beside = self._site(tmp_path, monkeypatch, f"[paths]\nroot = {tmp_path}\n")
        assert main(["status"], env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=FakeGpu()) == 0
        assert f"config: {beside}\n" in capsys.readouterr().out

    def test_doctor_fails_when_the_hooks_file_does_not_parse(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: FakeHost, capsys: pytest.CaptureFixture[str]
    ) -> None:
        beside = self._site(tmp_path, monkeypatch, f"[paths]\nroot = {tmp_path}\n[policy]\nno_such_key = 1\n")
        default = Path(schema.DEFAULT_CONFIG)
        default.parent.mkdir(parents=True)
        default.write_text(f"[paths]\nroot = {tmp_path}\n")  # parses, but the hooks do not read it
        os.chmod(default, 0o644)
        main(["doctor", "--json"], env={"SLURMD_NODENAME": "gb01"}, host=host, gpu=FakeGpu())
        checks = {c["name"]: c for c in envelope(capsys)["data"]}
        assert checks["imexctl.config"]["status"] == "FAIL" and "no_such_key" in checks["imexctl.config"]["message"]
        assert str(beside) in checks["imexctl.config"]["fix"], checks["imexctl.config"]
        files = checks["imexctl.config_files"]
        assert files["status"] == "WARN" and f"the hooks read {beside}" in files["message"], files
        assert str(default) in files["message"], files
