"""imexctl why JOBID: a job's story on a tray, told from the log the real hooks wrote (over FakeHost)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from imexctl import cli
from imexctl.commands import why
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost, job_env

LOG = "var/log/imexctl.log"
# why tells a job's story from the log the hooks wrote, and a command writes [paths] log_file only as root
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks write [paths] log_file only as root")


@pytest.fixture
def cfg(root: Path) -> Path:
    return write_config(
        root,
        {
            "paths": {"root": str(root)},
            "daemon": {"backend": "exec", "kill_grace_s": 1, "stop_timeout_s": 1},
            "readiness": {"deadline_s": 5, "poll_initial_s": 0.03, "poll_max_s": 1},
        },
    )


def hook(cfg: Path, host: FakeHost, gpu: FakeGpu, name: str, job_id: int, **env: str) -> int:
    return cli.main(["--config", str(cfg), name], env=job_env(job_id=job_id, **env), host=host, gpu=gpu)


def run_why(cfg: Path, job_id: int, *args: str) -> int:
    return cli.main(["--config", str(cfg), "why", str(job_id), *args], env={"SLURMD_NODENAME": "gb01"})


def test_set_up_then_torn_down(cfg: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.real_nodes = False  # the same teardown line as root and as another user: no channel node
    assert hook(cfg, host, gpu, "prolog", 42) == 0
    assert hook(cfg, host, gpu, "epilog", 42) == 0
    capsys.readouterr()
    assert run_why(cfg, 42) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "job 42 on gb01: set up, torn down"
    told = "\n".join(out)
    assert "prolog  daemon started (exec, port 61042)" in told
    assert "prolog  set up: 2 trays, port 61042, channel /" in told and ", ready, in " in told
    assert f"epilog  torn down: stop daemon of job 42; remove {cfg.parent}/run/imexctl/jobs/42" in told
    assert out[-1].startswith(f"read: {cfg.parent / LOG} (")


def test_lost_its_daemon(cfg: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    hook(cfg, host, gpu, "prolog", 43)
    for p in host.procs.values():
        p.alive = False
    hook(cfg, host, gpu, "epilog", 43)
    capsys.readouterr()
    assert run_why(cfg, 43) == 0
    out = capsys.readouterr().out
    assert out.startswith("job 43 on gb01: set up, lost its daemon, torn down\n")
    assert "epilog  lost its daemon: not running" in out


def test_failed_with_its_code_and_where_to_read(cfg: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    host.ready_after = 10**6
    host.slurm_nodes["gb01"] = {"state": "IDLE"}
    conf = cfg.parent / "slurm.conf"
    conf.write_text("NodeName=gb[01-02]\n")  # the trays: the channel's clique
    assert hook(cfg, host, gpu, "prolog", 44, SLURM_CONF=str(conf)) == 75
    hook(cfg, host, gpu, "epilog", 44)
    capsys.readouterr()
    assert run_why(cfg, 44) == 0
    out = capsys.readouterr().out
    assert out.startswith("job 44 on gb01: failed\n")
    assert "prolog  failed: not_ready (exit 75): IMEX not ready after" in out
    assert "prolog  drained the node: imex:not_ready gb01 job 44: " in out
    assert "epilog  nothing to tear down here" in out
    assert "  see docs/troubleshooting.md#not_ready\n" in out


def test_skipped_and_why(cfg: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    hook(cfg, host, gpu, "prolog", 45, SLURM_JOB_OVERSUBSCRIBE="OK")
    capsys.readouterr()
    assert run_why(cfg, 45, "--json") == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["outcomes"] == ["skipped"]
    assert [e["event"] for e in data["events"]] == ["imex.skipped", "prolog.done"]
    assert "may share its trays" in data["events"][0]["text"]
    assert data["events"][-1]["line"]["skipped"]


def test_leftovers_removed_by_another_jobs_prolog(cfg: Path, host: FakeHost, gpu: FakeGpu, capsys: Any) -> None:
    """Job 46's epilog never ran; job 47's prolog removed what it left: why 46 tells that too."""
    hook(cfg, host, gpu, "prolog", 46)
    for p in host.procs.values():
        p.alive = False
    hook(cfg, host, gpu, "prolog", 47)
    capsys.readouterr()
    assert run_why(cfg, 46) == 0
    out = capsys.readouterr().out
    assert "prolog  leftovers removed: leftovers of job 46, which no longer runs here" in out
    assert run_why(cfg, 4) == 1  # the digits of 46 and 47 are no job 4
    assert capsys.readouterr().err.startswith("imexctl why: job 4: no line in ")


def test_rotated_files_newest_first_and_stops_before_older_ones(root: Path, cfg: Path, capsys: Any) -> None:
    """The epilog in imexctl.log, the prolog in imexctl.log.1, another job in .2.gz: the reading stops there,
    and the much older run of the same job id in .3.gz (ids come round again) is not read."""
    log = root / LOG
    log.parent.mkdir(parents=True)

    def line(job_id: int, stamp: str, **fields: Any) -> str:
        return json.dumps({**fields, "job_id": job_id, "node": "gb01", "timestamp": stamp}) + "\n"

    log.write_text(line(48, "T3", event="epilog.done", hook="epilog", ok=True, actions=["stop daemon of job 48"]))
    (root / f"{LOG}.1").write_text(
        "not json 48\n" + line(48, "T2", event="prolog.done", hook="prolog", ok=True, trays=2, port=61048, ready=True)
    )
    for name, job_id, stamp in ((f"{LOG}.2.gz", 7, "T1"), (f"{LOG}.3.gz", 48, "T0")):
        with gzip.open(root / name, "wt") as f:
            f.write(line(job_id, stamp, event="prolog.done", hook="prolog", ok=True, skipped="x"))
    for name, when in ((f"{LOG}.1", 1000), (f"{LOG}.2.gz", 500), (f"{LOG}.3.gz", 100)):
        os.utime(root / name, (when, when))
    (root / f"{LOG}.2.gz.tmp").write_text("not a rotated copy\n")
    files = why.log_files(log)
    assert files == [log, root / f"{LOG}.1", root / f"{LOG}.2.gz", root / f"{LOG}.3.gz"]
    lines, read = why.read_job(files, 48)
    assert [x["timestamp"] for x in lines] == ["T2", "T3"] and read.unreadable == 1
    assert read.files == tuple(str(p) for p in files[:3])
    assert run_why(cfg, 48) == 0 and capsys.readouterr().out.startswith("job 48 on gb01: set up, torn down\n")


def test_the_read_is_capped(root: Path) -> None:
    log = root / LOG
    log.parent.mkdir(parents=True)
    log.write_text("x" * 1000 + "\n" + json.dumps({"event": "prolog.done", "ok": True, "job_id": 49}) + "\n")
    lines, read = why.read_job([log], 49, max_bytes=500)
    assert lines == [] and read.truncated is True


def test_log_text_is_data(root: Path, cfg: Path, capsys: Any) -> None:
    """A reason that quotes someone's text with terminal escapes is printed escaped; JSON keeps it as a string."""
    log = root / LOG
    log.parent.mkdir(parents=True)
    bad = {"ok": False, "error_code": "job_env_invalid", "exit_code": 65, "reason": "SLURM_JOB_USER='\x1b[2J\x07x'"}
    log.write_text(
        json.dumps({**bad, "event": "prolog.done", "job_id": 50, "hook": "prolog", "node": "gb\x1b01"}) + "\n"
    )
    assert run_why(cfg, 50) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "job 50 on gb\\x1b01: failed" in out and "SLURM_JOB_USER='\\x1b[2J\\x07x'" in out
    assert run_why(cfg, 50, "--json") == 0
    assert json.loads(capsys.readouterr().out)["data"]["events"][0]["line"]["reason"] == bad["reason"]


def test_not_in_the_log(cfg: Path, capsys: Any) -> None:
    assert run_why(cfg, 51, "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["errors"][0]["code"] == "job_not_in_log" and out["data"]["outcomes"] == []


@pytest.mark.parametrize("arg", ["0", "-3", "4294967296", "1e3", "١٢"])
def test_a_job_id_that_is_none(cfg: Path, arg: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["--config", str(cfg), "why", arg], env={})
    assert err.value.code == 64 and "is not a Slurm job id" in capsys.readouterr().err


# ---------------------------------------------------------------- only root's records (issue 41)

#: an unprivileged owner for the files a local user would leave (nobody)
NOBODY = 65534


def _jline(job_id: int, stamp: str, **fields: Any) -> str:
    return json.dumps({**fields, "job_id": job_id, "node": "gb01", "timestamp": stamp}) + "\n"


#: root's record of job 52: its prolog skipped it
ROOTS = _jline(52, "T1", event="prolog.done", hook="prolog", ok=True, skipped="policy: partition cpu")
#: a story somebody else wrote: the job failed, the tray was drained, another tray was to blame
FORGED = _jline(
    52, "T9", event="prolog.done", hook="prolog", ok=False, error_code="not_ready", exit_code=75,
    reason="FORGED: gb02 blocked every port",
)  # fmt: skip


def _rotated_root_story(root: Path) -> Path:
    """Root's log rotated into imexctl.log.1 (logrotate's ``create 0640 root root``); the log path itself free."""
    log = root / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    (root / f"{LOG}.1").write_text(ROOTS)
    (root / f"{LOG}.1").chmod(0o640)
    os.utime(root / f"{LOG}.1", (1000, 1000))
    return log


def _forge(path: Path, text: str, *, uid: int = NOBODY, mode: int = 0o640) -> None:
    """A file with ``text`` (gzip for ``.gz``) owned by ``uid`` with ``mode``, as its owner would leave it."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    os.chown(path, uid, uid)
    path.chmod(mode)


def test_a_log_file_and_a_rotated_copy_of_another_owner_are_left_out(root: Path, cfg: Path, capsys: Any) -> None:
    """A user's file at the log's path and one at a rotated copy's: why tells only root's record, and names both.

    Issue 41: in a directory its group may write (Ubuntu's /var/log) a member
    renames their own file over imexctl.log; why told that story as root's.
    """
    log = _rotated_root_story(root)
    _forge(log, FORGED)
    _forge(root / f"{LOG}.2.gz", FORGED)  # newer than .1: read before it if it were trusted
    assert run_why(cfg, 52) == 0
    out = capsys.readouterr().out
    assert out.startswith("job 52 on gb01: skipped\n"), out
    assert "FORGED" not in out and "not_ready" not in out
    assert f"skipped {log}: not root's record (owner uid {NOBODY}, mode 0640), left out" in out
    assert f"skipped {root / LOG}.2.gz: not root's record (owner uid {NOBODY}, mode 0640), left out" in out
    assert f"read: {root / LOG}.1 (" in out
    assert run_why(cfg, 52, "--json") == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["outcomes"] == ["skipped"] and [e["line"]["timestamp"] for e in data["events"]] == ["T1"]
    assert data["read"]["files"] == [f"{root / LOG}.1"]
    assert data["read"]["skipped"] == [
        {"file": str(log), "why": f"not root's record (owner uid {NOBODY}, mode 0640)"},
        {"file": f"{root / LOG}.2.gz", "why": f"not root's record (owner uid {NOBODY}, mode 0640)"},
    ]


def test_a_file_of_roots_that_others_may_write_is_left_out(root: Path, cfg: Path, capsys: Any) -> None:
    """Root owns it, but group or others may write it: anyone of them may have written its lines."""
    log = _rotated_root_story(root)
    _forge(log, FORGED, uid=0, mode=0o646)
    _forge(root / f"{LOG}.2", FORGED, uid=0, mode=0o660)
    assert run_why(cfg, 52, "--json") == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert [e["line"]["timestamp"] for e in data["events"]] == ["T1"]
    assert [s["why"] for s in data["read"]["skipped"]] == [
        "not root's record (owner uid 0, mode 0646)",
        "not root's record (owner uid 0, mode 0660)",
    ]


def test_a_refused_log_without_the_job_elsewhere_is_not_in_log_and_says_why(root: Path, cfg: Path, capsys: Any) -> None:
    """Only a forged file holds the job: exit 1, job_not_in_log, and the message names the file left out."""
    log = root / LOG
    log.parent.mkdir(parents=True)
    _forge(log, FORGED)
    assert run_why(cfg, 52) == 1
    captured = capsys.readouterr()
    assert "FORGED" not in captured.out + captured.err
    assert captured.err.startswith(f"imexctl why: job 52: no line in root's records; skipped {log}: not root's")
    assert run_why(cfg, 52, "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["errors"][0]["code"] == "job_not_in_log" and f"skipped {log}" in out["errors"][0]["message"]
    assert out["data"]["events"] == [] and out["data"]["read"]["skipped"][0]["file"] == str(log)


def test_a_symlink_or_a_fifo_at_the_log_path_is_left_out(root: Path, cfg: Path, capsys: Any) -> None:
    """A symlink at the log's path (even to a file of root's) is never followed; a FIFO neither blocks nor counts."""
    log = _rotated_root_story(root)
    elsewhere = root / "elsewhere.log"
    elsewhere.write_text(FORGED)
    log.symlink_to(elsewhere)
    os.mkfifo(root / f"{LOG}.2")
    assert run_why(cfg, 52) == 0
    out = capsys.readouterr().out
    assert out.startswith("job 52 on gb01: skipped\n") and "FORGED" not in out
    assert f"skipped {log}: is a symbolic link (not followed), left out" in out
    assert f"skipped {root / LOG}.2: not a regular file, left out" in out


# ---------------------------------------------------------------- a log host's files (--log, issue 42)

#: recorded from the real hooks on a simulated rack, through real journald and rsyslogd (tests/data/README.md)
WHYLOG = Path(__file__).resolve().parents[1] / "data" / "whylog"
TRAYS = ("tray01", "tray02", "tray03")
#: every form of the three trays' lines in one file (merged), and what wrote it
MERGED = {
    "rsyslog-fileformat.log": "rsyslog RSYSLOG_FileFormat (RFC 3164 layout, RFC 3339 time)",
    "rsyslog-traditional.log": "rsyslog RSYSLOG_TraditionalFileFormat (RFC 3164)",
    "rsyslog-protocol23.log": "rsyslog RSYSLOG_SyslogProtocol23Format (RFC 5424)",
    "journal-imexctl-all.json": "journalctl -t imexctl -o json --all",
    "journal-short-iso.log": "journalctl -t imexctl -o short-iso",
    "journal-short.log": "journalctl -t imexctl -o short",
}


def _source(name: str) -> list[dict[str, Any]]:
    """The lines the tray's hooks wrote, and root's line its journal and syslog got after them (more.json)."""
    more = json.loads((WHYLOG / "more.json").read_text())
    lines = [json.loads(x) for x in (WHYLOG / f"{name}.imexctl.log").read_text().splitlines()]
    return lines + [json.loads(line) for uid, line in more.get(name, []) if uid == 0]


def _expected(job_id: int) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """Per tray: the outcomes and (timestamp, event) of each told line, by why's story of the tray's own lines."""
    out = {}
    for name in TRAYS:
        outcomes, entries = why.story([x for x in _source(name) if x.get("job_id") == job_id])
        if entries:
            out[name] = (outcomes, [(e.timestamp, e.event) for e in entries])
    return out


def _told(data: dict[str, Any]) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """Per tray (``host>node`` where a line names another node than its sender) what ``_expected`` says."""
    return {
        t["node"] if t["host"] in (None, t["node"]) else f"{t['host']}>{t['node']}": (
            t["outcomes"],
            [(e["timestamp"], e["event"]) for e in t["events"]],
        )
        for t in data["trays"]
    }


#: the forged line from nobody on tray01 (more.json), in the forms that keep no _UID: tray01's, naming tray03
FORGED_TRAY = {"tray01>tray03": (["failed"], [("2026-01-01T00:00:00Z", "prolog.done")])}


def why_log(job_id: int, *logs: str | Path, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """``imexctl why JOBID --log ... --json`` with no config anywhere: a log host's."""
    argv = ["--config", "/nonexistent/imexctl.conf", "why", str(job_id), "--json"]
    for log in logs:
        argv += ["--log", str(log)]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(argv, env=env or {})
    return rc, json.loads(out.getvalue())


@pytest.mark.parametrize("name", sorted(MERGED))
@pytest.mark.parametrize("job_id", [7001, 7002, 700])
def test_each_forwarded_form_tells_each_tray_what_its_own_log_tells(name: str, job_id: int) -> None:
    """The trays' lines merged in one file of each form: per tray, the story its own imexctl.log tells.

    Job 7001: set up on three trays, tray02's daemon lost; 7002: tray03 never ready, all failed (and tray03's
    epilog crashed, a line of 6 KiB); 700: skipped on tray01 and tray02, and its id is in the other two.
    """
    rc, out = why_log(job_id, WHYLOG / name)
    assert rc == 0, out["errors"]
    told = _told(out["data"])
    forged = FORGED_TRAY if job_id == 7001 and name.startswith("journal-short") else {}
    assert told == {**_expected(job_id), **forged}, MERGED[name]
    told = {tray: t for tray, t in told.items() if tray not in forged}
    assert out["data"]["read"]["unreadable"] == 0 and "node" not in out["data"]
    outcomes = {tray: t[0] for tray, t in told.items()}
    if job_id == 7001:
        assert outcomes == {
            "tray01": ["set up", "torn down"],
            "tray02": ["set up", "lost its daemon", "torn down"],
            "tray03": ["set up", "torn down"],
        }
    elif job_id == 7002:
        assert outcomes == {"tray01": ["failed"], "tray02": ["failed"], "tray03": ["failed", "crashed"]}
    else:
        assert outcomes == {"tray01": ["skipped"], "tray02": ["skipped"]}


def test_the_per_host_files_of_a_log_host_several_logs_gz_and_stdin(root: Path, monkeypatch: Any) -> None:
    """rsyslog's file per host (DynaFile), named by several --log, one of them gzip: the same story as merged;
    and the merged file on standard input (``--log -``), gzip there too."""
    gz = root / "rsyslog-tray02.log.1.gz"
    gz.write_bytes(gzip.compress((WHYLOG / "rsyslog-tray02.log").read_bytes()))
    rc, out = why_log(7001, WHYLOG / "rsyslog-tray01.log", gz, WHYLOG / "rsyslog-tray03.log")
    assert rc == 0 and _told(out["data"]) == _expected(7001)
    assert out["data"]["read"]["files"] == [
        str(WHYLOG / "rsyslog-tray01.log"),
        str(gz),
        str(WHYLOG / "rsyslog-tray03.log"),
    ]
    import io

    for data in (
        (WHYLOG / "rsyslog-protocol23.log").read_bytes(),
        gzip.compress((WHYLOG / "rsyslog-protocol23.log").read_bytes()),
    ):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
        rc, out = why_log(7001, "-")
        assert rc == 0 and _told(out["data"]) == _expected(7001) and out["data"]["read"]["files"] == ["-"]


def test_the_text_answers_per_tray_and_says_what_it_read(capsys: Any) -> None:
    log = WHYLOG / "rsyslog-fileformat.log"
    assert cli.main(["why", "7001", "--log", str(log)], env={}) == 0
    out = capsys.readouterr().out
    verdicts = [line for line in out.splitlines() if line.startswith("job ")]
    assert verdicts == [
        "job 7001 on tray01: set up, torn down",
        "job 7001 on tray02: set up, lost its daemon, torn down",
        "job 7001 on tray03: set up, torn down",
    ]
    assert "  epilog  lost its daemon: not running" in out
    lines = len(log.read_text().splitlines())
    assert out.splitlines()[-1] == f"read: {log} (0.0 MiB, {lines} lines); 3 trays", out


def test_a_journal_message_left_out_is_counted_and_said(capsys: Any) -> None:
    """``journalctl -o json`` without ``--all`` prints a field over 4096 bytes as null: tray03's crash line.

    It is counted as a line that could not be read, in the text too, with where and why (issue 42: the count
    was only in --json, and why answered job_not_in_log while 32 lines named the job).
    """
    log = WHYLOG / "journal-imexctl.json"
    rc, out = why_log(7002, log)
    assert rc == 0 and out["data"]["read"]["unreadable"] == 1
    expected = _expected(7002)
    expected["tray03"] = (["failed"], [e for e in expected["tray03"][1] if e[1] != "imexctl.crashed"])
    assert _told(out["data"]) == expected
    (where,) = out["data"]["read"]["unread"]
    assert where.startswith(f"{log}:") and "MESSAGE null" in where and "--all" in where
    assert cli.main(["why", "7002", "--log", str(log)], env={}) == 0
    text = capsys.readouterr().out
    assert f"could not read 1 line: {where}" in text


def test_the_journal_tells_only_roots_lines(root: Path) -> None:
    """A user on tray01 logs as imexctl (``logger -t imexctl``) that job 7001 failed on tray03: the journal
    records its ``_UID`` (65534), and why leaves that line out, counted and named.

    Unfiltered (``journalctl -o json``): journald's own entries are no line of imexctl; tray03's crash line,
    whose MESSAGE journalctl left out, may be about any job: it counts as unread for 7001 too.
    """
    log = WHYLOG / "journal.json"
    rc, out = why_log(7001, log)
    assert rc == 0 and _told(out["data"]) == _expected(7001)
    assert "FORGED" not in json.dumps(out["data"]["trays"])
    read = out["data"]["read"]
    assert read["others"] == 1 and read["unreadable"] == 1 and "MESSAGE null" in read["unread"][0]
    assert len(read["not_roots"]) == 1 and "_UID 65534" in read["not_roots"][0]


def test_a_line_naming_another_node_is_told_apart_under_the_host_that_sent_it(capsys: Any) -> None:
    """In a syslog form the sender's host name is the syslog daemon's (the tray's), the node a line names is
    its own text: tray01's forged line about tray03 is told as tray01's, apart, never in tray03's story."""
    log = WHYLOG / "journal-short-iso.log"  # the journal's syslog form keeps no _UID: the forged line is read
    rc, out = why_log(7001, log)
    assert rc == 0
    trays = {(t["host"], t["node"]): t for t in out["data"]["trays"]}
    assert set(trays) == {("tray01", "tray01"), ("tray02", "tray02"), ("tray03", "tray03"), ("tray01", "tray03")}
    assert trays[("tray01", "tray03")]["outcomes"] == ["failed"]
    assert trays[("tray03", "tray03")]["outcomes"] == ["set up", "torn down"]
    assert cli.main(["why", "7001", "--log", str(log)], env={}) == 0
    text = capsys.readouterr().out
    assert "job 7001 on tray01 (its lines name node tray03): failed\n" in text
    assert "job 7001 on tray03: set up, torn down\n" in text


def test_journal_cat_has_only_the_lines_own_node() -> None:
    """``journalctl -o cat`` keeps the message alone: each line is told under the node it names. With no sender
    and no _UID, the forged line is tray03's there (docs/troubleshooting.md: read the journal as JSON)."""
    rc, out = why_log(7002, WHYLOG / "journal-cat.log")
    assert rc == 0 and _told(out["data"]) == _expected(7002)
    assert all(t["host"] is None for t in out["data"]["trays"])
    rc, out = why_log(7001, WHYLOG / "journal-cat.log")
    assert rc == 0 and _told(out["data"])["tray03"][0] == ["failed", "set up", "torn down"]


def test_a_log_host_needs_no_config(root: Path) -> None:
    """With --log no config is read: a broken one beside SLURM_CONF changes nothing (a log host has none)."""
    (root / "imexctl.conf").write_text("[readiness]\ndeadline = 5\n")
    (root / "slurm.conf").write_text("")
    env = {"SLURM_CONF": str(root / "slurm.conf")}
    assert cli.main(["why", "7001", "--log", str(WHYLOG / "journal-cat.log")], env=env) == 0
    assert cli.main(["why", "7001"], env=env) == 78  # without --log: this tray's log, by its config


# ---------------------------------------------------------------- the forms' grammar

PROLOG = {
    "event": "prolog.done",
    "hook": "prolog",
    "ok": True,
    "skipped": "policy",
    "timestamp": "2026-12-01T10:00:00Z",
}


def _msg(job_id: int = 61, node: str = "gb01", **more: Any) -> str:
    return json.dumps({**PROLOG, "job_id": job_id, "node": node, **more})


@pytest.mark.parametrize(
    ("line", "host"),
    [
        # RFC 5424: PRI, VERSION, TIMESTAMP (fraction 1-6 digits, Z or +hh:mm), HOSTNAME, APP-NAME, PROCID, MSGID
        (f"<30>1 2026-12-01T10:00:00.123456+01:00 gb01 imexctl 4242 - - {_msg()}", "gb01"),
        (f"<30>1 2026-12-01T10:00:00Z gb01 imexctl - - - {_msg()}", "gb01"),
        # no PRI (a file template without it); structured data; a BOM before the message
        (f'1 2026-12-01T10:00:00.5Z gb01 imexctl 4242 ID7 [origin ip="10.0.0.1"][x@1 a="q\\"\\]"] {_msg()}', "gb01"),
        (f"<30>1 2026-12-01T10:00:00Z gb01 imexctl 4242 - - \ufeff{_msg()}", "gb01"),
        # NILVALUE host and time: the line's own node
        (f"<30>1 - - imexctl 4242 - - {_msg()}", None),
        # RFC 3164: Mmm, the day padded with a space; PRI or not; TAG[pid]: , TAG: , and rsyslog's TAG[pid] of a
        # line received in RFC 5424 (no colon)
        (f"<30>Dec  1 10:00:00 gb01 imexctl[4242]: {_msg()}", "gb01"),
        (f"Dec 11 10:00:00 gb01 imexctl: {_msg()}", "gb01"),
        (f"Dec 01 10:00:00.123456 gb01 imexctl[4242] {_msg()}", "gb01"),
        # rsyslog's RFC 3339 time; journalctl -o short-iso's offset without a colon
        (f"2026-12-01T10:00:00.123456+00:00 gb01.cluster imexctl[4242]: {_msg()}", "gb01.cluster"),
        (f"2026-12-01T10:00:00+0000 gb01 imexctl[4242]: {_msg()}", "gb01"),
        # journalctl -o cat, imexctl.log itself; -o json-seq's record separator
        (_msg(), None),
        (
            "\x1e" + json.dumps({"_HOSTNAME": "gb01", "SYSLOG_IDENTIFIER": "imexctl", "_UID": "0", "MESSAGE": _msg()}),
            "gb01",
        ),
        # journalctl -o json: MESSAGE as an array of bytes
        (
            json.dumps(
                {"_HOSTNAME": "gb01", "SYSLOG_IDENTIFIER": "imexctl", "_UID": "0", "MESSAGE": list(_msg().encode())}
            ),
            "gb01",
        ),
    ],
)
def test_each_form_is_read(root: Path, line: str, host: str | None) -> None:
    log = root / "one.log"
    log.write_text(line + "\n")
    rc, out = why_log(61, log)
    assert rc == 0, out
    (tray,) = out["data"]["trays"]
    assert (tray["host"], tray["node"], tray["outcomes"]) == (host, "gb01", ["skipped"])
    assert out["data"]["read"]["unreadable"] == 0


@pytest.mark.parametrize(
    ("line", "why_not"),
    [
        # rsyslog's default maxMessageSize (8 KiB) cut the line
        (f"Dec  1 10:00:00 gb01 imexctl[4242]: {_msg(reason='x' * 9000)}"[:8192], "not a JSON object"),
        (f"<30>1 2026-12-01T10:00:00Z gb01 imexctl 4242 - - {_msg()[:-1]}", "not a JSON object"),
        # PRIVAL is 0..191, VERSION a digit 1-9 then up to two: neither RFC 5424 nor RFC 3164
        (f"<192>1 2026-12-01T10:00:00Z gb01 imexctl 4242 - - {_msg()}", "no form"),
        (f"[2026-12-01T10:00:00.123] error: prolog failed: rc:75 output:{_msg()}", "no form"),
        (
            json.dumps(
                {"_HOSTNAME": "gb01", "SYSLOG_IDENTIFIER": "imexctl", "_UID": "0", "MESSAGE": [255, 254, 54, 49]}
            ),
            "not UTF-8",
        ),
    ],
)
def test_a_line_that_names_the_job_but_cannot_be_read_is_counted(
    root: Path, line: str, why_not: str, capsys: Any
) -> None:
    """Counted, and named with its file and line; alone it is job_not_in_log, whose message says so."""
    log = root / "one.log"
    log.write_text("Dec  1 10:00:00 gb01 sshd[99]: session 61 opened\n" + line + "\n")  # another program's: not counted
    rc, out = why_log(61, log)
    assert rc == 1 and out["errors"][0]["code"] == "job_not_in_log"
    assert out["data"]["read"]["unreadable"] == 1 and out["data"]["read"]["lines"] == 2
    assert out["data"]["read"]["unread"][0].startswith(f"{log}:2: {why_not}")
    assert "1 line naming it could not be read" in out["errors"][0]["message"]
    assert cli.main(["why", "61", "--log", str(log)], env={}) == 1
    assert f"1 line naming it could not be read: {log}:2: {why_not}" in capsys.readouterr().err


def test_another_programs_line_and_another_jobs_are_not_the_jobs(root: Path) -> None:
    """Only imexctl's lines count: a syslog line of another program and another job's line are neither told
    nor counted as unread; the job's id inside another id (610, 6100) is not the job."""
    log = root / "one.log"
    log.write_text(
        f"Dec  1 10:00:00 gb01 slurmd[99]: {_msg(61)}\n"
        f"Dec  1 10:00:01 gb01 imexctl[1]: {_msg(610)}\n"
        f"Dec  1 10:00:02 gb01 imexctl[1]: {_msg(6100)}\n"
    )
    rc, out = why_log(61, log)
    assert rc == 1 and out["data"]["read"]["unreadable"] == 0 and out["data"]["trays"] == []


def test_duplicates_are_told_once(root: Path) -> None:
    """The same line twice (a file named twice, a unit's stderr beside syslog): told once per tray."""
    log = root / "one.log"
    log.write_text(f"Dec  1 10:00:00 gb01 imexctl[1]: {_msg()}\n")
    rc, out = why_log(61, log, log)
    assert rc == 0 and len(out["data"]["trays"][0]["events"]) == 1 and out["data"]["read"]["duplicates"] == 1


def test_a_log_that_cannot_be_read_is_named(root: Path) -> None:
    rc, out = why_log(61, root / "absent.log", WHYLOG / "journal-cat.log")
    assert rc == 1 and out["data"]["read"]["errors"] == [f"{root / 'absent.log'}: No such file or directory"]
    assert f"not read: {root / 'absent.log'}: No such file or directory" in out["errors"][0]["message"]


def test_the_labs_rsyslog_layouts_are_rsyslogs() -> None:
    """tests.lab.whylogs renders rsyslog's three templates where rsyslog is not installed: byte for byte what the
    real rsyslogd wrote, given its time, host and pid."""
    import re

    from tests.lab.whylogs import rfc3164, rfc5424

    for name, pattern in (
        ("rsyslog-fileformat.log", r"(\S+) (\S+) imexctl\[(\d+)\] (.*)"),
        ("rsyslog-traditional.log", r"(\w{3} [ \d]\d \S+) (\S+) imexctl\[(\d+)\] (.*)"),
        ("rsyslog-protocol23.log", r"<30>1 (\S+) (\S+) imexctl (\d+) - -  (.*)"),
    ):
        for line in (WHYLOG / name).read_text().splitlines():
            m = re.fullmatch(pattern, line)
            assert m, line
            stamp, host, pid, msg = m.groups()
            render = rfc5424 if "protocol23" in name else rfc3164
            assert render(stamp, host, int(pid), msg) == line


# ---------------------------------------------------------------- troubleshooting.md's commands, held to the code

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _job_id_section() -> str:
    text = (DOCS / "troubleshooting.md").read_text()
    start = text.index("## Starting from a job id\n")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(lang: str) -> list[str]:
    import re

    blocks = re.findall(rf"^ *```{lang}\n(.*?)^ *```", _job_id_section(), flags=re.DOTALL | re.MULTILINE)
    return [re.sub(r"^ {3}", "", b, flags=re.MULTILINE) for b in blocks]


def _pipe_parts(line: str) -> list[str]:
    """A shell line cut at its pipes, not at those inside ``$(...)``."""
    parts, depth, cur = [], 0, ""
    for i, c in enumerate(line):
        depth += 1 if line[i : i + 2] == "$(" else -1 if c == ")" and depth else 0
        if c == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return [*parts, cur]


def _commands(name: str) -> list[list[str]]:
    """Each run of ``name`` in the section's shell blocks, as its words: a pipe's part, ``ssh HOST`` and
    ``clush ...`` before it left out."""
    import shlex

    found = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            for part in _pipe_parts(line):
                words = shlex.split(part)
                if words[:1] == ["ssh"]:
                    words = words[2:]
                elif words[:1] == ["clush"]:
                    words = words[next(i for i, w in enumerate(words) if w.split("/")[-1] == "imexctl") :]
                if words and words[0].split("/")[-1] == name:
                    found.append(words)
    return found


def test_the_sections_why_commands_parse() -> None:
    from imexctl.cli.parser import build_parser

    uses = _commands("imexctl")
    whys = [build_parser().parse_args(words[1:]) for words in uses if words[1:2] == ["why"]]
    assert len(whys) >= 4 and sum(bool(a.log) for a in whys) >= 3
    for words in uses:  # every command of the section parses: its options exist
        build_parser().parse_args(words[1:])


#: journalctl's options the section may use: the journal's forms why reads (design.md source journal-json)
JOURNALCTL = {"-D": True, "-t": True, "-o": True, "--all": False}


def test_the_sections_journalctl_commands_give_a_form_why_reads_whole() -> None:
    """Every journalctl of the section selects imexctl's entries as JSON with --all (no MESSAGE left out)."""
    uses = _commands("journalctl")
    assert len(uses) >= 2
    for words in uses:
        opts = iter(words[1:])
        seen = {}
        for w in opts:
            assert w in JOURNALCTL, f"{w} in {words}"
            seen[w] = next(opts) if JOURNALCTL[w] else ""
        assert seen.get("-t") == "imexctl" and seen.get("-o") == "json" and "--all" in seen, words


#: sacctmgr show event's options and fields, from Slurm's source (design.md source sacctmgr-event)
SACCTMGR_KEYS = {"Nodes", "Start", "End", "Reason", "States", "User", "Format", "Clusters", "Event"}
SACCTMGR_FIELDS = {"NodeName", "Start", "End", "State", "Reason", "User", "Duration", "Event", "Cluster", "StateRaw"}


def test_the_sections_sacctmgr_command_uses_options_that_exist() -> None:
    """Against the source's options, and the installed sacctmgr(1) when there is one (Debian's slurm-client)."""
    (words,) = _commands("sacctmgr")
    assert words[1:4] == ["-nP", "show", "event"], words
    pairs = dict(w.split("=", 1) for w in words[4:])
    assert set(pairs) <= SACCTMGR_KEYS and set(pairs["Format"].split(",")) <= SACCTMGR_FIELDS, pairs
    assert pairs["Reason"] == "imex" and pairs["Start"].startswith("now-")
    man = Path("/usr/share/man/man1/sacctmgr.1.gz")
    if man.exists():
        page = gzip.decompress(man.read_bytes()).decode(errors="replace")
        events = page[page.index("SPECIFICATIONS FOR EVENTS") : page.index("SPECIFICATIONS FOR FEDERATION")]
        options, fields = events.split("EVENT FORMAT OPTIONS")
        assert all(f"\\fB{key}\\fR=" in options for key in pairs if key != "Format"), pairs
        assert all(f"\\fB{field}\\fR" in fields for field in pairs["Format"].split(",")), pairs


def test_the_sections_rsyslog_actions_are_those_the_recorded_files_came_from() -> None:
    """The doc's tray and log host actions use the templates and transport that wrote tests/data/whylog/."""
    import re

    def actions(text: str) -> set[tuple[str, str, str]]:
        out = set()
        for action in re.findall(r"action\((.*?)\)", text):
            kv = dict(re.findall(r'(\w+)="([^"]*)"', action))
            out.add((kv["type"], kv.get("template", ""), kv.get("protocol", "")))
        return out

    recorded = actions((WHYLOG / "rsyslog-tray.conf").read_text() + (WHYLOG / "rsyslog-loghost.conf").read_text())
    documented = actions("".join(_blocks("text")))
    assert documented == {("omfwd", "RSYSLOG_SyslogProtocol23Format", "tcp"), ("omfile", "RSYSLOG_FileFormat", "")}
    assert documented <= recorded
    assert (
        'maxMessageSize="64k"' in (WHYLOG / "rsyslog-tray.conf").read_text() and "maxMessageSize" in _job_id_section()
    )


def test_the_sections_sample_answer_has_the_codes_lines(root: Path, capsys: Any) -> None:
    """The sample's verdict, read, could-not-read and left-out lines are the ones why prints (numbers and names
    aside)."""
    import re

    (sample,) = [b for b in _blocks("text") if b.startswith("job ")]
    log = root / "fleet.log"
    cut = f"Dec  1 10:00:00 gb01 imexctl[4242]: {_msg(reason='x' * 9000)}"[:8192]
    other = json.dumps({"_HOSTNAME": "gb01", "SYSLOG_IDENTIFIER": "imexctl", "_UID": "1001", "MESSAGE": _msg()})
    log.write_text(f"Dec  1 10:00:00 gb01 imexctl[4242]: {_msg()}\n{cut}\n{other}\n")
    assert cli.main(["why", "61", "--log", str(log)], env={}) == 0
    printed = capsys.readouterr().out

    def shape(text: str) -> set[str]:
        text = re.sub(r"(\S*fleet\.log|(?<= )-)(:\d+)?", "FILE", text)
        text = re.sub(r"\b\d+ (line|tray)s?\b", r"N \1s", text)
        text = re.sub(r"job \d+ on \S+: [^\n]*", "VERDICT", text)
        return {re.sub(r"\d+(\.\d+)?", "N", line) for line in text.splitlines() if not line.startswith("  ")}

    assert shape(sample) <= shape(printed), (sample, printed)


def test_the_sections_journalctl_command_on_a_real_journal_answers(root: Path) -> None:
    """tray02's lines sent to a real journald (a namespace of its own, host name tray02) by syslog, read back by
    the section's journalctl command and piped to its why command: tray02's story, told by its _HOSTNAME."""
    import shlex
    import subprocess
    import sys

    from tests.lab.whylogs import journal_available, journal_of
    from tests.support.ci import unavailable

    if journal_available():
        unavailable(journal_available())
    lines = (WHYLOG / "tray02.imexctl.log").read_text().splitlines()
    journal = journal_of("tray02", lines, root / "journal")
    (line,) = [x for b in _blocks("sh") for x in b.splitlines() if x.startswith("journalctl -D ")]
    produce, consume = (shlex.split(p) for p in _pipe_parts(line))
    produce[produce.index("-D") + 1] = str(journal)
    assert consume[:2] == ["imexctl", "why"]
    consume[2] = "7001"
    entries = subprocess.run(produce, capture_output=True, check=True, timeout=60).stdout
    told = subprocess.run(
        [sys.executable, "-m", "imexctl", *consume[1:], "--json"],
        input=entries,
        capture_output=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd="/",
    )
    assert told.returncode == 0, told.stderr
    data = json.loads(told.stdout)["data"]
    assert [(t["host"], t["node"]) for t in data["trays"]] == [("tray02", "tray02")]
    assert _told(data) == {"tray02": _expected(7001)["tray02"]}


def test_journal_only_logging_says_how_to_read_the_journal(root: Path, capsys: Any) -> None:
    """``[paths] log_file =`` (empty), the journal only: why on the tray says the command that reads it."""
    cfg = write_config(root, {"paths": {"root": str(root), "log_file": ""}, "log": {"syslog": "yes"}})
    assert cli.main(["--config", str(cfg), "why", "62"], env={"SLURMD_NODENAME": "gb01"}) == 1
    err = capsys.readouterr().err
    assert "[paths] log_file is empty" in err and "journalctl -t imexctl -o json --all | imexctl why 62 --log -" in err
