"""log: one structlog configuration, JSON lines to the log file, stderr (by level) and syslog."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import structlog

from imexctl.platform import log, logsetup


def lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in text.splitlines()]


def test_file_gets_every_line_and_stderr_only_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file takes every line from the configured level up; stderr only warnings and errors."""
    assert logsetup.configure_logging(level="debug", log_file=tmp_path / "sub" / "imexctl.log") is None
    structlog.contextvars.bind_contextvars(job_id=7, node="gb01", hook="prolog")
    logger = structlog.get_logger()
    logger.debug("imex.health.poll", attempt=1)
    logger.info("prolog.done", ok=True)
    logger.error("prolog.done", ok=False, reason="x")
    in_file = lines((tmp_path / "sub" / "imexctl.log").read_text())
    assert [(r["event"], r["level"]) for r in in_file] == [
        ("imex.health.poll", "debug"),
        ("prolog.done", "info"),
        ("prolog.done", "error"),
    ]
    # field order: the call's fields, the event, the bound context, level, timestamp
    keys = list(in_file[1])
    assert keys[:2] == ["ok", "event"] and set(keys[2:5]) == {"job_id", "node", "hook"}
    assert keys[5:] == ["level", "timestamp"]
    assert [r["level"] for r in lines(capsys.readouterr().err)] == ["error"]
    assert os.stat(tmp_path / "sub" / "imexctl.log").st_mode & 0o777 == 0o640


def test_level_filters_every_sink(capsys: pytest.CaptureFixture[str]) -> None:
    """[log] level = warning drops info lines everywhere; -v (stderr_level info) shows info on stderr."""
    logsetup.configure_logging(level="warning", stderr_level="info")
    structlog.get_logger().info("prolog.done", ok=True)
    structlog.get_logger().warning("imex.not_ready", status="x")
    assert [r["event"] for r in lines(capsys.readouterr().err)] == ["imex.not_ready"]


def test_unopenable_file_is_reported_and_stderr_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log file that cannot be opened (a symlink there) gives a warning text; logging goes to stderr."""
    (tmp_path / "imexctl.log").symlink_to(tmp_path / "elsewhere")
    problem = logsetup.configure_logging(log_file=tmp_path / "imexctl.log")
    assert problem is not None and "cannot open log file" in problem
    structlog.get_logger().error("imexctl.failed", reason="r")
    assert lines(capsys.readouterr().err)[0]["event"] == "imexctl.failed"
    assert not (tmp_path / "elsewhere").exists()


def test_syslog_opened_once_with_priorities(monkeypatch: pytest.MonkeyPatch) -> None:
    """With syslog, openlog runs once at set-up (ident imexctl, daemon facility) and each line gets its priority."""
    import syslog

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(syslog, "openlog", lambda *a: calls.append(("openlog", a)))
    monkeypatch.setattr(
        syslog, "syslog", lambda prio, line: calls.append(("syslog", (prio, json.loads(line)["event"])))
    )
    sink = log.SinkLogger(None, io.StringIO(), 30, syslog=True)
    for method in ("info", "warning", "error", "exception"):
        getattr(sink, method)(json.dumps({"event": method}))
    assert calls == [
        ("openlog", ("imexctl", syslog.LOG_PID, syslog.LOG_DAEMON)),
        ("syslog", (syslog.LOG_INFO, "info")),
        ("syslog", (syslog.LOG_WARNING, "warning")),
        ("syslog", (syslog.LOG_ERR, "error")),
        ("syslog", (syslog.LOG_ERR, "exception")),
    ]


def test_one_function_renders_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """structlog's chain ends in render_event, which calls render_json: the LineLogger's renderer."""
    logsetup.configure_structlog(log.SinkLogger(None, None, 50, False), "info")
    assert structlog.get_config()["processors"][-1] is logsetup.render_event
    structlog.contextvars.clear_contextvars()
    seen: list[Any] = []
    monkeypatch.setattr(log, "render_json", lambda value: seen.append(dict(value)) or "x")
    sink = log.SinkLogger(None, None, 50, False)
    logsetup.configure_structlog(sink, "info")
    structlog.get_logger().info("prolog.done", ok=True)
    log.LineLogger(sink, "info", {"hook": "prolog"}).info("prolog.done", ok=True)
    assert [{k: v for k, v in d.items() if k != "timestamp"} for d in seen] == [
        {"ok": True, "event": "prolog.done", "level": "info"},
        {"ok": True, "event": "prolog.done", "hook": "prolog", "level": "info"},
    ]


def test_a_hooks_lines_stay_on_its_sink_without_structlog_until_it_crashes() -> None:
    """A hook's log-file warning and failure line go through its LineLogger; a crash configures structlog
    then, on the same sink and with the hook's bound fields, so that the trace is logged."""
    from imexctl.platform.errors import ConfigError

    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    out = io.StringIO()
    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "gb02"}
    try:
        context = {"hook": "prolog", "job_id": env["SLURM_JOB_ID"], "node": env["SLURMD_NODENAME"]}
        hook = logsetup.setup_hook_logging("info", context, (log.SinkLogger(out, None, 50, False), "no log file"))
        hook.bind_context(job_id=9)
        logsetup.log_failure(ConfigError("bad key"))
        assert not structlog.is_configured()
        try:
            _boom()
        except RuntimeError:
            logsetup.log_crash()
        assert structlog.is_configured()
    finally:
        logsetup.reset_logging()
        structlog.contextvars.clear_contextvars()
    recs = lines(out.getvalue())
    assert [(r["event"], r["level"], r["job_id"], r["node"], r["hook"]) for r in recs] == [
        ("imexctl.failed", "warning", "9", "gb02", "prolog"),
        ("imexctl.failed", "error", 9, "gb02", "prolog"),
        ("imexctl.crashed", "error", 9, "gb02", "prolog"),
    ]
    assert recs[0]["reason"] == "no log file" and recs[1]["error_code"] == "config_invalid"
    assert "RuntimeError: boom" in recs[2]["exception"]


def _boom() -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    "ns",
    [
        0,
        1_000,
        999,
        1_733_340_623_000_000_000,
        1_733_340_623_000_120_999,
        1_733_340_623_999_999_999,
        4_102_444_800_500_000_000,
    ],
)
def test_utc_timestamp_is_structlogs_iso_utc(ns: int) -> None:
    """Microseconds truncated and left out when 0, a Z for UTC: what TimeStamper(fmt="iso", utc=True) writes."""
    import datetime as dt

    when = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)
    assert log.utc_timestamp(ns) == when.isoformat().replace("+00:00", "Z")


def test_a_line_loggers_timestamp_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line's timestamp is the wall clock's at the call, as structlog's stamper would give it."""
    sink = io.StringIO()
    monkeypatch.setattr(log.time, "time_ns", lambda: 1_733_340_623_000_120_999)
    log.LineLogger(log.SinkLogger(sink, None, 20, False), "info", {}).info("x")
    assert json.loads(sink.getvalue())["timestamp"] == "2024-12-04T19:30:23.000120Z"


# ---------------------------------------------------------------- the log file (issue 33)


class TestLogFile:
    def test_a_new_file_is_made_and_appended(self, tmp_path: Path) -> None:
        """In a directory of this user's: the file is created 0640 (whatever the umask keeps) and appended to."""
        path = tmp_path / "log" / "imexctl.log"
        with log.open_log_file(path) as f:
            f.write("one\n")
        with log.open_log_file(path, make_dir=False) as f:
            f.write("two\n")
        assert path.read_text() == "one\ntwo\n"

    def test_a_fifo_is_refused_at_once(self, tmp_path: Path) -> None:
        """A FIFO at the log's name (no reader): refused without waiting, named as a FIFO."""
        path = tmp_path / "imexctl.log"
        os.mkfifo(path)
        with pytest.raises(OSError, match="is a FIFO"):
            log.open_log_file(path)

    def test_a_fifo_with_a_reader_is_refused(self, tmp_path: Path) -> None:
        """A FIFO someone reads: the open would succeed, the type check refuses it."""
        path = tmp_path / "imexctl.log"
        os.mkfifo(path)
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            with pytest.raises(OSError, match="not a regular file"):
                log.open_log_file(path)
        finally:
            os.close(reader)

    def test_a_symlink_is_not_followed(self, tmp_path: Path) -> None:
        """A symlink at the log's name: refused, its target untouched."""
        (tmp_path / "target").write_text("")
        (tmp_path / "imexctl.log").symlink_to(tmp_path / "target")
        with pytest.raises(OSError, match="symbolic link"):
            log.open_log_file(tmp_path / "imexctl.log")
        assert (tmp_path / "target").read_text() == ""

    @pytest.mark.parametrize(("mode", "ok"), [(0o755, True), (0o775, True), (0o777, False), (0o1777, False)])
    def test_the_directory_may_be_the_groups_never_others(self, tmp_path: Path, mode: int, ok: bool) -> None:
        """Group-writable (Ubuntu's /var/log, root:syslog 0775) is accepted; writable by others is refused."""
        d = tmp_path / "log"
        d.mkdir()
        d.chmod(mode)
        assert (log.dir_problem(d) == "") is ok
        if ok:
            log.open_log_file(d / "imexctl.log").close()
        else:
            with pytest.raises(OSError, match="not writable by others"):
                log.open_log_file(d / "imexctl.log")
            assert list(d.iterdir()) == []

    def test_open_sink_names_the_problem_and_keeps_stderr(self, tmp_path: Path) -> None:
        """A refused log file is a problem text, not an error: the run logs to stderr."""
        path = tmp_path / "imexctl.log"
        os.mkfifo(path)
        sink, problem = log.open_sink(log_file=path)
        assert sink._file is None  # stderr only
        assert problem == f"cannot open log file {path}: is a FIFO (not a regular file)"


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    """A value of the kinds log lines hold, with what json.dumps escapes: quotes, backslashes, control characters,
    DEL, non-ASCII text, non-finite floats, non-string keys, nesting."""
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        alphabet = ['"', "\\", "\x7f", "é", "\u2028", *map(chr, range(32)), *"abcXYZ019 -_/.:[]{}"]
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 1:
        return "".join(rng.choice("abcdefghij0123456789 -_./:") for _ in range(rng.randrange(20)))
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**70), rng.randrange(-(10**6), 10**6)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e-7, 1e21, float("inf"), float("-inf"), float("nan"), rng.random()])
    if kind == 4:
        return rng.choice([True, False, None])
    if kind == 5:
        return rng.choice(["", "ok", "prolog.done"])
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    keys = [rng.choice(["a", "job_id", 'q"', "\n", 1, 2.5, None, True]) for _ in range(rng.randrange(4))]
    return {k: _random_value(rng, depth + 1) for k in keys}


def test_render_json_writes_what_json_dumps_writes() -> None:
    """render_json is byte for byte json.dumps (structlog's JSONRenderer) on 20,000 random values: what it renders
    itself (plain ASCII, the common case without escapes included) and what it leaves to json.dumps."""
    rng = random.Random(20261205)
    for _ in range(20_000):
        value = {"event": "x", "v": _random_value(rng)}
        assert log.render_json(value) == json.dumps(value), value
