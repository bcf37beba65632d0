"""Hook start-up: what the cheap runs import, and that their log lines are structlog's, field for field.

The timings are bench/run's; these tests check, without timing anything, the
two things the fast paths promise: a prolog that policy skips, an epilog
with nothing to do and ``imexctl --version`` import none of the heavy
dependencies, and the lines they write read exactly like structlog's.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.platform import log, logsetup
from tests.support.fakes import FakeGpu, FakeHost, job_env

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("structlog", "tenacity", "psutil", "pynvml", "asyncio", "ssl")
# -I like the console script's interpreter; the checkout first on the path, then main() as the script runs it
PROBE = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(REPO)!r})\n"
    "from imexctl.cli import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    rc = exc.code\n"
    f"print(json.dumps([rc, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n"
)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog and the epilog run as root")


def probe(*argv: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run imexctl in a fresh interpreter; its exit code and the heavy modules it imported."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, *argv], env=env or {}, capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    rc, loaded = json.loads(out.splitlines()[-1])
    return rc, loaded


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def hook_lines(cfg: Settings, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """A hook's lines: from the log file as root; else from stderr (only root writes the log file), run with -v."""
    if os.geteuid() == 0:
        return lines(cfg.paths.log_file)
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]


@pytest.fixture
def skip_cfg(make_settings: Callable[..., Settings]) -> Settings:
    """Settings whose policy skips every job outside partition gpu; no NVML check."""
    return make_settings(policy={"jobs": "partitions", "partitions": "gpu", "fabric": "none"})


def test_version_imports_nothing_heavy() -> None:
    """``imexctl --version`` imports none of structlog, tenacity, psutil, pynvml."""
    assert probe("--version") == (0, [])


@as_root
def test_skipped_prolog_imports_nothing_heavy(skip_cfg: Settings) -> None:
    """A prolog that policy skips exits 0, logs its lines and imports no heavy module."""
    env = job_env(job_id=77, node="gb01", SLURM_JOB_PARTITION="cpu")
    assert probe("--config", str(skip_cfg.source), "prolog", env=env) == (0, [])
    assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["imex.skipped", "prolog.done"]


@as_root
def test_idle_epilog_imports_nothing_heavy(skip_cfg: Settings) -> None:
    """An epilog for a job that left nothing here exits 0, logs epilog.done and imports no heavy module."""
    assert probe("--config", str(skip_cfg.source), "epilog", env=job_env(job_id=78)) == (0, [])
    assert [r["event"] for r in lines(skip_cfg.paths.log_file)] == ["epilog.done"]


@as_root
def test_epilog_with_state_takes_the_full_path(skip_cfg: Settings) -> None:
    """An epilog whose job left its directory here is no idle epilog: it tears down, logging without structlog."""
    skip_cfg.paths.job(79).path.mkdir(parents=True)
    rc, loaded = probe("--config", str(skip_cfg.source), "epilog", env=job_env(job_id=79))
    assert rc == 0 and "structlog" not in loaded
    assert not skip_cfg.paths.job(79).exists()
    *_, done = recs = lines(skip_cfg.paths.log_file)
    assert (done["event"], done["ok"], done["job_id"], done["hook"]) == ("epilog.done", True, 79, "epilog"), recs
    assert all(r["job_id"] == 79 and r["node"] == "gb01" for r in recs), recs


def test_skipped_prolog_lines(skip_cfg: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """The fast path's prolog lines: the summary's fields, event, hook/job_id/node, level, timestamp."""
    env = job_env(job_id=77, SLURM_JOB_PARTITION="cpu")
    assert main(["--config", str(skip_cfg.source), "-v", "prolog"], env=env, host=FakeHost(), gpu=FakeGpu()) == 0
    skipped, done = hook_lines(skip_cfg, capsys)
    reason = "partition cpu is not in [policy] partitions"
    assert list(skipped)[:2] == ["reason", "event"] and list(skipped)[-2:] == ["level", "timestamp"]
    assert list(done)[:5] == ["ok", "duration_s", "skipped", "event", "hook"]
    common = {"hook": "prolog", "job_id": 77, "node": "gb01", "level": "info"}
    assert skipped == {"reason": reason, "event": "imex.skipped", **common, "timestamp": skipped["timestamp"]}
    assert done == {
        "ok": True,
        "duration_s": 0.0,
        "skipped": reason,
        "event": "prolog.done",
        **common,
        "timestamp": done["timestamp"],
    }
    assert not structlog.is_configured()


def test_idle_epilog_line(skip_cfg: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """The fast path's epilog line carries ok, no actions and the duration, like the full epilog's."""
    assert main(["--config", str(skip_cfg.source), "-v", "epilog"], env=job_env(job_id=5), host=FakeHost()) == 0
    (done,) = hook_lines(skip_cfg, capsys)
    assert list(done) == ["ok", "actions", "duration_s", "event", "hook", "job_id", "node", "level", "timestamp"]
    assert (done["ok"], done["actions"], done["event"], done["job_id"], done["node"]) == (
        True,
        [],
        "epilog.done",
        5,
        "gb01",
    )
    assert not structlog.is_configured()


class _Odd:
    def __repr__(self) -> str:
        return "<odd>"


class _Own:
    def __structlog__(self) -> str:
        return "own"


CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("info", "prolog.done", {"ok": True, "duration_s": 0.012, "skipped": "partition cpu"}),
    ("warning", "imexctl.failed", {"error_code": "log_file", "reason": "cannot open \u00e9"}),
    ("error", "epilog.done", {"ok": False, "actions": ["a", "b"], "none": None, "path": Path("/x")}),
    ("debug", "imex.health.poll", {"attempt": 1}),
    ("info", "imex.ready", {"odd": _Odd(), "own": _Own(), "node": "overrides-context"}),
]


def _normal(line: str) -> tuple[list[str], dict[str, Any]]:
    """Key order with the bound context as one block (structlog's order within it varies per run), and values."""
    record = json.loads(line)
    record.pop("timestamp")
    keys = list(record)
    context = [k for k in keys if k in ("hook", "job_id") or (k == "node" and "overrides" not in record[k])]
    first = keys.index(context[0])
    return [*keys[:first], "<context>", *keys[first + len(context) :]], record


@pytest.mark.parametrize("level", ["debug", "info", "error"])
def test_line_logger_renders_like_structlog(level: str) -> None:
    """LineLogger writes, for every call, the line structlog's configured processors write (but the timestamp)."""
    ours, theirs = io.StringIO(), io.StringIO()
    line_logger = log.LineLogger(log.SinkLogger(ours, None, 50, syslog=False), level, {"hook": "prolog"})
    line_logger.bind_context(job_id="77", node="gb01")
    line_logger.bind_context(job_id=77)
    logsetup.configure_structlog(log.SinkLogger(theirs, None, 50, syslog=False), level)
    structlog.contextvars.bind_contextvars(hook="prolog", job_id="77", node="gb01")
    structlog.contextvars.bind_contextvars(job_id=77)
    for method, event, kw in CALLS:
        getattr(line_logger, method)(event, **kw)
        getattr(structlog.get_logger(), method)(event, **kw)
    ours_lines, theirs_lines = ours.getvalue().splitlines(), theirs.getvalue().splitlines()
    assert [_normal(x) for x in ours_lines] == [_normal(x) for x in theirs_lines]
    assert len(ours_lines) == {"debug": 5, "info": 4, "error": 1}[level]
    assert json.loads(ours_lines[0])["timestamp"].endswith("Z")
