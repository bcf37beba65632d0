"""The hooks' fast tier (imexctl.hooks.entry.fast): it answers only what the full command would answer, the same way.

Three promises, each checked without timing anything (the timings are bench/run's):
- it imports none of the modules that made a hook start slowly (a fresh interpreter without site-packages);
- where it answers, the full command (``cli.main`` with a real host, which never takes the fast path)
  writes the same lines and exits the same way;
- where it is not sure (an unusual command line or config file, metrics, a bad environment, a job that
  left something here, not root), it answers None and leaves the run to the full command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.cli import main
from imexctl.cli.parser import build_parser
from imexctl.config import schema
from imexctl.config.settings import Settings
from imexctl.hooks import entry
from imexctl.platform.host import RealHost
from tests.support.fakes import FakeGpu, job_env

REPO = Path(__file__).resolve().parents[2]
#: what the fast path must not import: each cost a hook 2 to 60 ms (docs/performance.md)
SLOW = (
    "argparse",
    "asyncio",
    "collections",
    "configparser",
    "dataclasses",
    "enum",
    "inspect",
    "json",
    "pathlib",
    "psutil",
    "pynvml",
    "re",
    "ssl",
    "structlog",
    "tenacity",
    "typing",
)
# -S: no site-packages (the fast path needs none; were it to fall back, the full command's imports would fail)
PROBE = (
    "import sys\n"
    f"sys.path.insert(0, {str(REPO)!r})\n"
    "from imexctl.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    f"loaded = sorted(m for m in {SLOW!r} if m in sys.modules)\n"
    "sys.stdout.write('\\n' + repr([rc, loaded]) + '\\n')\n"
)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog and the epilog run as root")


def probe(*argv: str, env: dict[str, str]) -> tuple[int, list[str], str]:
    """Run imexctl in a fresh ``-I -S`` interpreter: exit code, the slow modules it imported, its stdout."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, *argv], env=env, capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    *printed, result = out.rstrip("\n").split("\n")
    rc, loaded = eval(result)  # noqa: S307 - our own probe's repr of an int and a list of str
    return rc, loaded, "\n".join(printed).strip()


def answer(argv: list[str], env: dict[str, str]) -> int | None:
    """The fast tier's exit code for this command line, or None where it leaves the run to the next tiers."""
    return entry.fast(argv, env)[0]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def same(record: dict[str, Any]) -> dict[str, Any]:
    """A log line without what differs between two runs (the time), key order kept."""
    return {k: ("<t>" if k in ("timestamp", "duration_s") else v) for k, v in record.items()}


@pytest.fixture
def skip_cfg(make_settings: Callable[..., Settings]) -> Settings:
    """Settings whose policy skips every job outside partition gpu; no NVML check; the log directory exists."""
    cfg = make_settings(policy={"jobs": "partitions", "partitions": "gpu", "fabric": "none"})
    assert cfg.paths.log_file is not None
    cfg.paths.log_file.parent.mkdir(parents=True)
    return cfg


@pytest.fixture
def both(skip_cfg: Settings) -> Iterator[Callable[..., tuple[Any, ...]]]:
    """Run a command through the fast path, then through the full command; exit codes and new log lines of each."""
    log_file = skip_cfg.paths.log_file
    assert log_file is not None

    def run(argv: list[str], env: dict[str, str]) -> tuple[Any, ...]:
        before = len(lines(log_file))
        fast = answer(argv, env)
        after = len(lines(log_file))
        full = main(argv, env=env, host=RealHost(), gpu=FakeGpu())
        records = lines(log_file)
        return fast, full, records[before:after], records[after:]

    yield run


# ---- what it imports


def test_version_imports_nothing_slow() -> None:
    """``imexctl --version`` answers from the fast path, as argparse's version action does."""
    assert probe("--version", env={}) == (0, [], f"imexctl {__import__('imexctl').__version__}")


@as_root
def test_skipped_prolog_imports_nothing_slow(skip_cfg: Settings) -> None:
    """A prolog that policy skips imports none of the slow modules, and logs its two lines."""
    env = job_env(job_id=77, node="gb01", SLURM_JOB_PARTITION="cpu")
    assert probe("--config", str(skip_cfg.source), "prolog", env=env)[:2] == (0, [])
    assert skip_cfg.paths.log_file is not None
    assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["imex.skipped", "prolog.done"]


@as_root
def test_idle_epilog_imports_nothing_slow(skip_cfg: Settings) -> None:
    """An epilog for a job that left nothing here imports none of the slow modules, and logs epilog.done."""
    assert probe("--config", str(skip_cfg.source), "epilog", env=job_env(job_id=78))[:2] == (0, [])
    assert skip_cfg.paths.log_file is not None
    assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["epilog.done"]


#: imexctl's modules each fast answer loads, and no other: a module costs a hook about 0.1 ms before its first line
#: runs, a record class about 0.05 ms (docs/performance.md "Hook start-up"), so one more here is a cost to weigh
FAST_MODULES = ("imexctl", "imexctl.cli", "imexctl.hooks", "imexctl.hooks.entry")
FAST_MODULES_HOOK = (
    *FAST_MODULES,
    "imexctl.config",
    "imexctl.config.schema",
    "imexctl.hooks.gate",
    "imexctl.platform",
    "imexctl.platform.log",
    "imexctl.slurm",
    "imexctl.slurm.job",
)
#: what else a fast answer may load: what ``site`` loads at every start of the console script's interpreter (this
#: test runs without it, -S), and ``__future__`` (every module's first line); ``errno`` (0.07 ms), say, is not
STDLIB = ("__future__", "_collections_abc", "_stat", "genericpath", "os", "os.path", "posixpath", "stat")
LOADS = {
    # the packages' versions under /opt/imexctl: the one in use, one installed beside it (imexctl/platform/versions.py)
    "version": (*FAST_MODULES, "imexctl.platform", "imexctl.platform.versions"),
    "prolog": (*FAST_MODULES_HOOK, "imexctl.slurm.nodelist"),  # the node list: the epilog never reads it
    "epilog": (*FAST_MODULES_HOOK, "imexctl.channels", "imexctl.channels.notes", "imexctl.platform.procscan"),
}


@as_root
@pytest.mark.parametrize("command", sorted(LOADS))
def test_each_fast_answer_loads_only_its_modules(skip_cfg: Settings, command: str) -> None:
    """``--version`` loads the front door only; a skipped prolog and an idle epilog the light modules they need.

    And nothing else of the standard library than the interpreter's start loads anyway.
    """
    code = (
        f"import sys\nbefore = set(sys.modules)\nsys.path.insert(0, {str(REPO)!r})\nfrom imexctl.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "print(rc, *sorted(set(sys.modules) - before))\n"
    )
    argv = ["--version"] if command == "version" else ["--config", str(skip_cfg.source), command]
    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu")
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, *argv], env=env, capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    rc, *loaded = out.splitlines()[-1].split()
    assert (rc, [m for m in loaded if m.split(".")[0] == "imexctl"]) == ("0", sorted(LOADS[command]))
    assert set(loaded) - set(LOADS[command]) <= set(STDLIB), sorted(set(loaded) - set(LOADS[command]) - set(STDLIB))


# ---- where it answers, it answers as the full command


@as_root
@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_skipped_prolog_matches_the_full_command(
    both: Callable[..., tuple[Any, ...]], skip_cfg: Settings, verbose: list[str]
) -> None:
    """Same exit code and same lines (fields, order, values) as the full command's skipped prolog."""
    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu", SLURM_JOB_NODELIST="gb[01-02]")
    fast, full, fast_lines, full_lines = both([*verbose, "--config", str(skip_cfg.source), "prolog"], env)
    assert (fast, full) == (0, 0)
    assert [same(r) for r in fast_lines] == [same(r) for r in full_lines]
    assert [r["event"] for r in fast_lines] == ["imex.skipped", "prolog.done"]
    assert fast_lines[1]["skipped"] == "partition cpu is not in [policy] partitions"


@as_root
def test_idle_epilog_matches_the_full_command(both: Callable[..., tuple[Any, ...]], skip_cfg: Settings) -> None:
    """Same exit code and line as the full epilog of a job that left nothing, het job included."""
    env = job_env(job_id=5, SLURM_HET_JOB_ID="4")
    fast, full, fast_lines, full_lines = both([f"--config={skip_cfg.source}", "epilog"], env)
    assert (fast, full) == (0, 0)
    assert [same(r) for r in fast_lines] == [same(r) for r in full_lines]
    assert [(r["event"], r["actions"], r["job_id"]) for r in fast_lines] == [("epilog.done", [], 5)]


# ---- where it is not sure, it leaves the run to the full command


@as_root
def test_a_prolog_for_a_job_that_gets_imex_is_not_fast(skip_cfg: Settings) -> None:
    """A job in partition gpu gets its domain: only the full prolog can do that."""
    env = job_env(job_id=77, SLURM_JOB_PARTITION="gpu")
    assert answer(["--config", str(skip_cfg.source), "prolog"], env) is None


@as_root
@pytest.mark.parametrize("left", ["job_dir", "het_job_dir", "process", "channel"])
def test_an_epilog_of_a_job_that_left_something_is_not_fast(
    skip_cfg: Settings, left: str, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """A job directory (its own or its het job's), or a process naming its config: full epilog. A channel node
    alone is not the job's (its number names no job: design.md "The channel rule"): the fast path answers."""
    cfg = make_settings(policy={"jobs": "all", "fabric": "none", "channel_count": "10"})
    assert cfg.paths.log_file is not None
    cfg.paths.log_file.parent.mkdir(parents=True, exist_ok=True)
    env = job_env(job_id=14, SLURM_HET_JOB_ID="12")
    argv = ["--config", str(cfg.source), "epilog"]
    assert answer(argv, env) == 0  # nothing left yet
    proc = None
    if left in ("job_dir", "het_job_dir"):
        cfg.paths.job(14 if left == "job_dir" else 12).path.mkdir(parents=True)
    elif left == "process":
        config = str(cfg.paths.job(12).config)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-c", config])
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + 10
        while config.encode() not in cmdline.read_bytes():  # until the child has exec'd
            assert time.monotonic() < deadline, "the child never showed its command line"
            time.sleep(0.01)
    else:
        cfg.paths.channel_dir.mkdir(parents=True)
        (cfg.paths.channel_dir / "channel6").touch()  # job 14 with 10 channels by the job-id rule: 1 + 14 % 9
    try:
        assert answer(argv, env) == (0 if left == "channel" else None)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


@as_root
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("continued value", "[policy]\njobs = partitions\npartitions = cpu,\n  gpu\n"),
        ("colon", "[policy]\njobs: partitions\npartitions = gpu\n"),
        ("metrics", "[policy]\njobs = partitions\npartitions = gpu\n[metrics]\ntextfile_dir = /m\n"),
        ("invalid", "[policy]\njobs = partitions\npartitions = gpu\nnot_a_key = 1\n"),
        ("broken", "[policy\njobs = partitions\n"),
    ],
)
def test_an_unusual_config_file_is_left_to_the_full_command(tmp_path: Path, name: str, text: str) -> None:
    """Continued values, ``key: value``, metrics, invalid keys, broken files: None, nothing written."""
    cfg = tmp_path / "imexctl.conf"
    cfg.write_text(f"[paths]\nroot = {tmp_path}\n{text}")
    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu")
    assert answer(["--config", str(cfg), "prolog"], env) is None, name
    assert not (tmp_path / "var").exists()


@as_root
@pytest.mark.parametrize(
    "change",
    [{"SLURM_JOB_ID": "x"}, {"SLURMD_NODENAME": ""}, {"SLURM_JOB_NODELIST": "gb[01-"}, {"SLURM_JOB_NODELIST": "gb02"}],
)
def test_a_bad_environment_is_left_to_the_full_command(skip_cfg: Settings, change: dict[str, str]) -> None:
    """A job id, node name or node list the full prolog would refuse (and name): None."""
    env = {**job_env(job_id=77, SLURM_JOB_PARTITION="cpu"), **change}
    assert answer(["--config", str(skip_cfg.source), "prolog"], env) is None


@as_root
def test_a_missing_log_directory_is_left_to_the_full_command(make_settings: Callable[..., Settings]) -> None:
    """The fast path never creates directories: the full command makes the log directory."""
    cfg = make_settings(policy={"jobs": "partitions", "partitions": "gpu", "fabric": "none"})
    assert cfg.paths.log_file is not None and not cfg.paths.log_file.parent.exists()
    assert answer(["--config", str(cfg.source), "epilog"], job_env(job_id=3)) is None


def test_not_root_is_left_to_the_full_command(skip_cfg: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: the full command refuses the hook by name."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert answer(["--config", str(skip_cfg.source), "epilog"], job_env(job_id=3)) is None


# ---- what it read goes to the full command, which reads neither again


@as_root
def test_the_full_command_reads_the_config_and_the_job_once(
    skip_cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epilog with work to do: the fast path's config values and job are the full epilog's (one read of each)."""
    from imexctl.slurm.job import JobContext

    reads: list[str] = []
    read_config, from_env = schema.read_config, JobContext.from_env.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(schema, "read_config", lambda *a, **kw: reads.append("config") or read_config(*a, **kw))
    monkeypatch.setattr(
        JobContext, "from_env", classmethod(lambda cls, *a, **kw: reads.append("job") or from_env(cls, *a, **kw))
    )
    skip_cfg.paths.job(79).path.mkdir(parents=True)  # something left: the full epilog runs
    assert main(["--config", str(skip_cfg.source), "epilog"], env=job_env(job_id=79)) == 0
    assert reads == ["config", "job"] and not skip_cfg.paths.job(79).exists()
    assert skip_cfg.paths.log_file is not None
    (done,) = [r for r in lines(skip_cfg.paths.log_file) if r["event"] == "epilog.done"]
    assert done["actions"][-1] == f"remove {skip_cfg.paths.job(79).path}" and done["job_id"] == 79


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the fast path reads only a config file that root owns")
def test_the_fast_tier_hands_over_what_it_read(skip_cfg: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it declines (a job that gets IMEX), it returns no exit code and the validated config and the job."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    env = job_env(job_id=77, SLURM_JOB_PARTITION="gpu")
    done, read = entry.fast(["--config", str(skip_cfg.source), "prolog"], env)
    assert done is None and read is not None
    assert (read.config, read.found, read.job.job_id if read.job else None) == (str(skip_cfg.source), True, 77)
    assert read.values["policy"]["partitions"] == ("gpu",)
    with pytest.raises(AttributeError):
        read.job = None  # type: ignore[misc]


# ---- the command line: a subset of what argparse reads, read the same


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["prolog"], ("prolog", None, False)),
        (["epilog"], ("epilog", None, False)),
        (["--config", "/c", "prolog"], ("prolog", "/c", False)),
        (["--config=/c", "-v", "epilog"], ("epilog", "/c", True)),
        (["--verbose", "--config", "/a", "--config", "/b", "prolog"], ("prolog", "/b", True)),
        (["prolog", "-v"], None),
        (["prolog", "epilog"], None),
        (["--config", "prolog"], None),
        (["--config"], None),
        (["--config="], None),
        (["--config", "-v", "prolog"], None),
        (["-vv", "prolog"], None),
        (["status"], None),
        (["--conf", "/c", "prolog"], None),
        ([], None),
    ],
)
def test_hook_args(argv: list[str], want: tuple[str, str | None, bool] | None) -> None:
    """Only plain hook command lines; each read as argparse reads it."""
    assert entry.hook_line(argv) == want
    if want is not None:
        args = build_parser().parse_args(argv)
        assert (args.command, args.config, args.verbose) == want


# ---- the console script


@as_root
@pytest.mark.parametrize(("argv", "ends"), [(["prolog"], "os._exit"), (["hostlist", "expand", "n[1-2]"], "sys.exit")])
def test_console_ends_a_hook_without_teardown(
    skip_cfg: Settings,
    argv: list[str],
    ends: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hook's process runs without the cyclic GC and ends with os._exit after flushing (slurmd waits for it);
    other commands keep the GC and exit normally."""
    import gc

    from imexctl import cli

    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu", IMEXCTL_CONFIG=str(skip_cfg.source))
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(sys, "argv", ["imexctl", *argv])
    exits: list[tuple[str, object]] = []

    def fake_os_exit(code: int) -> None:
        exits.append(("os._exit", code))
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", fake_os_exit)
    monkeypatch.setattr(gc, "disable", lambda: exits.append(("gc.disable", None)))
    with pytest.raises(SystemExit) as raised:
        cli.console()
    assert raised.value.code == 0
    assert exits == ([("gc.disable", None), ("os._exit", 0)] if ends == "os._exit" else [])
    if argv[0] == "hostlist":
        assert capsys.readouterr().out == "n1\nn2\n"
    else:
        assert skip_cfg.paths.log_file is not None
        assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["imex.skipped", "prolog.done"]


@as_root
def test_a_failing_fast_path_leaves_the_run_to_the_full_command(
    skip_cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error in the fast tier (a bug) does not fail the hook: main runs the full command."""

    def broken(argv: Any, env: Any) -> tuple[int | None, entry.Read | None]:
        raise RuntimeError("a bug in the fast path")

    monkeypatch.setattr(entry, "fast", broken)
    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu")
    assert main(["--config", str(skip_cfg.source), "prolog"], env=env) == 0
    assert skip_cfg.paths.log_file is not None
    assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["imex.skipped", "prolog.done"]
