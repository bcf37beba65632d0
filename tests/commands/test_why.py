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
    assert "prolog  drained the node: imex:not_ready gb01: " in out
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
