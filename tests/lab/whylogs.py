"""Forwarded forms of imexctl's log for ``imexctl why --log``: real journald here, rsyslog's layouts, a recorder.

``imexctl why JOBID --log FILE`` reads what a log host keeps of the trays' lines (docs/troubleshooting.md,
"Starting from a job id"). This module makes those files from the lines the real hooks wrote:

- :func:`journal_of`: a real ``systemd-journald`` (Debian's, the host's) in a mount and UTS namespace of its
  own, whose host name is the tray's, gets each line from ``logger`` over its syslog socket as the hooks'
  ``syslog(3)`` would send it (``[log] syslog = yes``: ident ``imexctl``, facility ``daemon``, the pid); the
  journal file it writes is then read back with the host's ``journalctl`` (``-o json``, ``-o cat``, ...). No
  systemd as PID 1 is needed; the namespace's own tmpfs keep the host's ``/run`` and ``/var/log`` untouched.
- :func:`rfc3164` and :func:`rfc5424`: the layouts of rsyslog's built-in templates ``RSYSLOG_FileFormat``,
  ``RSYSLOG_TraditionalFileFormat`` and ``RSYSLOG_SyslogProtocol23Format`` for a line received from a tray,
  for hosts where rsyslog is not installed (the lab test). tests/commands/test_why.py holds them to the files
  a real rsyslogd wrote (:func:`record`).
- :func:`record` (``python -m tests.lab.whylogs [--rsyslog DIR]``, root): runs the real hooks on a
  simulated rack (``imexctl.commands.demo.SimRack``), keeps each tray's ``imexctl.log``, and writes
  ``tests/data/whylog/``: the journal forms by :func:`journal_of`, and, with ``--rsyslog`` naming a root
  where Debian's rsyslog package is unpacked (``apt-get download rsyslog libestr0 libfastjson4 liblognorm5``,
  ``dpkg -x``), the files a log host's ``rsyslogd -n`` writes of the lines that each tray's own ``rsyslogd``
  forwards to it over TCP (127.0.0.1) in RFC 5424. tests/data/README.md says what each file is.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DATA",
    "JOURNALD",
    "journal_available",
    "journal_of",
    "journalctl",
    "more",
    "record",
    "rfc3164",
    "rfc5424",
    "runs",
]

DATA = Path(__file__).resolve().parents[1] / "data" / "whylog"
JOURNALD = Path("/lib/systemd/systemd-journald")
LOGGER = "/usr/bin/logger"
#: each tray's namespace: its host name, a journald on tmpfs, then logger for each run of the hooks
_TRAY_SH = r"""
set -eu
name=$1; work=$2; shift 2
hostname "$name"
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/journal /run/log "$work/journal" "$work/etc"
printf '[Journal]\nStorage=persistent\nReadKMsg=no\nForwardToSyslog=no\nForwardToWall=no\n' >"$work/etc/journald.conf"
mount --bind "$work/etc/journald.conf" /etc/systemd/journald.conf
mount --bind "$work/journal" /var/log/journal
JOURNALD </dev/null >/dev/null 2>&1 &
jpid=$!
trap 'kill "$jpid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S /run/systemd/journal/dev-log ] && break; sleep 0.05; done
# one file per run of a hook: its pid, then its lines; a uid other than 0 sends as that user
for run in "$work"/runs/*.lines; do
    read -r pid uid <"${run%.lines}.id"
    if [ "$uid" = 0 ]; then
        LOGGER --size 65536 -u /run/systemd/journal/dev-log -t imexctl --id="$pid" -p daemon.info <"$run"
    else
        setpriv --reuid="$uid" --regid="$uid" --clear-groups \
            LOGGER --size 65536 -u /run/systemd/journal/dev-log -t imexctl --id="$pid" -p daemon.info <"$run"
    fi
done
journalctl --flush
kill "$jpid"
wait "$jpid" || true
trap - EXIT
"""


def journal_available() -> str:
    """Why :func:`journal_of` cannot run here ('' when it can): root, unshare, journald, logger."""
    if os.geteuid() != 0:
        return "journald in a namespace needs root"
    missing = [
        p for p in (str(JOURNALD), LOGGER, "/usr/bin/unshare", "/usr/bin/journalctl") if not os.access(p, os.X_OK)
    ]
    return f"missing {', '.join(missing)}" if missing else ""


def runs(lines: Sequence[str], first_pid: int = 4000) -> list[tuple[int, list[str]]]:
    """The log's lines in runs of one hook (consecutive lines of one ``hook`` and ``job_id``), each with a pid."""
    out: list[tuple[int, list[str]]] = []
    last: tuple[object, object] | None = None
    for line in lines:
        rec = json.loads(line)
        key = (rec.get("hook"), rec.get("job_id"))
        if key != last or not out:
            out.append((first_pid + len(out), []))
            last = key
        out[-1][1].append(line)
    return out


def journal_of(name: str, lines: Sequence[str], work: Path, *, more: Sequence[tuple[int, str]] = ()) -> Path:
    """A journal file of a tray called ``name`` that got ``lines`` over syslog (as root), then each of ``more``
    ``(uid, line)`` as that user; returns the directory that holds it (``journalctl -D``)."""
    tray = work / name
    (tray / "runs").mkdir(parents=True)
    numbered = [(pid, body, 0) for pid, body in runs(lines)] + [
        (9000 + i, [line], uid) for i, (uid, line) in enumerate(more)
    ]
    for i, (pid, body, uid) in enumerate(numbered):
        run = tray / "runs" / f"{i:05d}.lines"
        run.write_text("".join(x + "\n" for x in body))
        run.with_suffix(".id").write_text(f"{pid} {uid}\n")
        os.chmod(run, 0o644)
    os.chmod(tray / "runs", 0o755)
    os.chmod(tray, 0o755)
    script = _TRAY_SH.replace("JOURNALD", str(JOURNALD)).replace("LOGGER", LOGGER)
    subprocess.run(
        [
            "/usr/bin/unshare",
            "--mount",
            "--uts",
            "--fork",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            script,
            "sh",
            *[name, str(tray)],
        ],
        check=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        start_new_session=True,
    )
    return tray / "journal"


def journalctl(dirs: Sequence[Path], *args: str) -> str:
    """``journalctl --file=F ... --no-pager ARGS`` over the journal files of several trays, merged by time."""
    files = [str(f) for d in dirs for f in sorted(d.rglob("*.journal"))]
    argv = ["/usr/bin/journalctl", "--no-pager", *(f"--file={f}" for f in files), *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def rfc3164(stamp: str, host: str, pid: int, msg: str) -> str:
    """A line as a log host's rsyslog writes one it got from a tray in RFC 5424, by ``RSYSLOG_FileFormat`` (``stamp``
    in RFC 3339) or ``RSYSLOG_TraditionalFileFormat`` (``Mmm dd hh:mm:ss``): ``<time> <host> imexctl[<pid>] <msg>``.

    The tag of a line received in RFC 5424 is ``APP-NAME[PROCID]``, without the colon of a local line's.
    """
    return f"{stamp} {host} imexctl[{pid}] {msg}"


def rfc5424(stamp: str, host: str, pid: int, msg: str, *, pri: int = 30) -> str:
    """A line as rsyslog's ``RSYSLOG_SyslogProtocol23Format`` writes it: ``<PRI>1 <time> <host> imexctl <pid> - -
    <msg>``, the message with the space the tray's syslog(3) put before it (hence two spaces)."""
    return f"<{pri}>1 {stamp} {host} imexctl {pid} - -  {msg}"


# ---------------------------------------------------------------- the recorder


@contextlib.contextmanager
def _rsyslog(root: Path, conf: str, work: Path, name: str) -> Iterator[None]:
    """``rsyslogd -n`` from the unpacked package under ``root`` with ``conf``, until the block ends."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    cfg = work / f"{name}.conf"
    cfg.write_text(conf)
    env = {"LD_LIBRARY_PATH": str(lib), "PATH": "/usr/bin:/bin"}
    argv = [str(root / "usr/sbin/rsyslogd"), "-n", "-f", str(cfg), "-i", str(work / f"{name}.pid")]
    argv += ["-M", str(lib / "rsyslog")]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=open(work / f"{name}.err", "w"))  # noqa: SIM115
    try:
        time.sleep(1.0)
        if proc.poll() is not None:
            raise RuntimeError(f"rsyslogd {name} exited {proc.returncode}: {(work / f'{name}.err').read_text()}")
        yield
    finally:
        time.sleep(1.0)
        proc.terminate()
        proc.wait(timeout=20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: the log host: RFC 5424 in from the trays over TCP, every line of imexctl out in four layouts
LOGHOST_CONF = """\
global(maxMessageSize="64k" workDirectory="{work}")
module(load="imtcp")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="PerHost" type="string" string="{work}/hosts/%HOSTNAME%.log")
if $programname == "imexctl" then {{
    action(type="omfile" file="{work}/fileformat.log" template="RSYSLOG_FileFormat")
    action(type="omfile" file="{work}/traditional.log" template="RSYSLOG_TraditionalFileFormat")
    action(type="omfile" file="{work}/protocol23.log" template="RSYSLOG_SyslogProtocol23Format")
    action(type="omfile" dynaFile="PerHost" template="RSYSLOG_FileFormat")
}}
"""
#: a tray: its syslog socket, its host name, and imexctl's lines forwarded in RFC 5424 (docs/troubleshooting.md)
TRAY_CONF = """\
global(maxMessageSize="64k" localHostName="{name}" workDirectory="{work}")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="{work}/{name}.sock" CreatePath="on")
if $programname == "imexctl" then {{
    action(type="omfwd" target="127.0.0.1" port="{port}" protocol="tcp" template="RSYSLOG_SyslogProtocol23Format")
}}
"""


def _record_rsyslog(root: Path, logs: dict[str, list[str]], out: Path) -> None:
    """The log host's four files of the trays' lines, each tray's rsyslogd forwarding to it."""
    work = Path(tempfile.mkdtemp(prefix="imxwr"))
    try:
        port = _free_port()
        (work / "hosts").mkdir()
        with contextlib.ExitStack() as stack:
            stack.enter_context(_rsyslog(root, LOGHOST_CONF.format(work=work, port=port), work, "loghost"))
            for name in logs:
                stack.enter_context(_rsyslog(root, TRAY_CONF.format(work=work, port=port, name=name), work, name))
            order = sorted(
                ((json.loads(line)["timestamp"], name, pid, line) for name in logs for pid, body in runs(logs[name])
                 for line in body),
            )  # fmt: skip
            for _, name, pid, line in order:
                sock = str(work / f"{name}.sock")
                subprocess.run(
                    [LOGGER, "--size", "65536", "-u", sock, "-t", "imexctl", f"--id={pid}", "-p", "daemon.info", line],
                    check=True,
                    timeout=30,
                )
                time.sleep(0.02)
        for name in ("fileformat", "traditional", "protocol23"):
            shutil.copyfile(work / f"{name}.log", out / f"rsyslog-{name}.log")
        for name in logs:
            shutil.copyfile(work / "hosts" / f"{name}.log", out / f"rsyslog-{name}.log")
        (out / "rsyslog-loghost.conf").write_text(LOGHOST_CONF)
        (out / "rsyslog-tray.conf").write_text(TRAY_CONF)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hook(rack: Any, t: Any, hook: str, job: int, trays: list[Any], **extra: str) -> int:
    env = {**rack.job_env(t, job, hook, trays), **extra}
    res = subprocess.run(
        [sys.executable, "-m", "imexctl", hook], env=env, capture_output=True, timeout=120, cwd="/", check=False
    )
    return res.returncode


def _jobs(rack: Any) -> None:
    """Job 7001 set up on three trays, tray02's daemon lost, torn down; job 7002 fails (tray03 never ready);
    job 700 skipped (it may share its trays) on two trays."""
    import psutil

    t1, t2, t3 = rack.trays
    assert [r.returncode for r in rack.run_hooks("prolog", 7001)] == [0, 0, 0]
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if "nvidia-imex-sim" in cmd and f"{t2.root}/" in cmd and "/7001/" in cmd:
            p.kill()
    time.sleep(0.5)
    rack.run_hooks("epilog", 7001)
    rack.set_faults(f"@{t3.address} never_ready")
    rack.run_hooks("prolog", 7002)
    rack.set_faults("")
    rack.run_hooks("epilog", 7002)
    for t in (t1, t2):
        _hook(rack, t, "prolog", 700, [t1, t2], SLURM_JOB_OVERSUBSCRIBE="OK")
        _hook(rack, t, "epilog", 700, [t1, t2], SLURM_JOB_OVERSUBSCRIBE="OK")


#: a line that a local user on tray01 sends with ident imexctl: job 7001 failed, tray03 to blame
FORGED = json.dumps(
    {
        "ok": False, "error_code": "not_ready", "exit_code": 75, "reason": "FORGED: tray03 blocked every port",
        "event": "prolog.done", "hook": "prolog", "job_id": 7001, "node": "tray03", "level": "error",
        "timestamp": "2026-01-01T00:00:00Z",
    }
)  # fmt: skip


#: constructed: a crash of tray03's epilog of job 7002 whose line (its traceback) is longer than journalctl's
#: 4096 bytes (``-o json`` then shows its MESSAGE as null, unless ``--all``)
LONG = json.dumps(
    {
        "exception": "Traceback (most recent call last):\n" + "".join(
            f'  File "/usr/lib/imexctl/versions/1/imexctl/hooks/step{i}.py", line {i}, in step{i}\n    step{i + 1}()\n'
            for i in range(60)
        ) + "RuntimeError: constructed", "event": "imexctl.crashed", "hook": "epilog", "job_id": 7002,
        "node": "tray03", "level": "error", "timestamp": "",
    }
)  # fmt: skip


def more(logs: dict[str, list[str]]) -> dict[str, list[tuple[int, str]]]:
    """What each tray's journal gets after the hooks' lines, as ``(uid, line)``: the forged line from nobody on
    tray01, and the long line on tray03, a second after tray03's last line."""
    last = json.loads(logs["tray03"][-1])["timestamp"]
    then = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(calendar.timegm(time.strptime(last[:19], "%Y-%m-%dT%H:%M:%S")) + 1)
    )
    return {"tray01": [(65534, FORGED)], "tray03": [(0, LONG.replace('"timestamp": ""', f'"timestamp": "{then}"'))]}


def record(rsyslog_root: Path | None) -> None:
    """Run the jobs on a simulated rack of three trays and write tests/data/whylog/ (see the module's text)."""
    from imexctl.commands.demo import SimRack

    problem = journal_available()
    if problem:
        raise SystemExit(problem)
    base = Path(tempfile.mkdtemp(prefix="imxwl", dir="/tmp"))
    rack = SimRack(base, 3, deadline_s=4, uid=1501, gid=1502, first_address=181)
    try:
        _jobs(rack)
        logs = {t.name: (t.root / "var/log/imexctl.log").read_text().splitlines() for t in rack.trays}
    finally:
        rack.kill_all()
    try:
        out = DATA
        out.mkdir(parents=True, exist_ok=True)
        for name, lines in logs.items():
            (out / f"{name}.imexctl.log").write_text("".join(x + "\n" for x in lines))
        extra = more(logs)
        (out / "more.json").write_text(json.dumps(extra, indent=1) + "\n")
        dirs = [journal_of(name, lines, base / "journal", more=extra.get(name, [])) for name, lines in logs.items()]
        (out / "journal.json").write_text(journalctl(dirs, "-o", "json"))
        (out / "journal-imexctl.json").write_text(journalctl(dirs, "-t", "imexctl", "-o", "json"))
        (out / "journal-imexctl-all.json").write_text(journalctl(dirs, "-t", "imexctl", "-o", "json", "--all"))
        (out / "journal-tray02.json").write_text(journalctl(dirs[1:2], "-t", "imexctl", "-o", "json"))
        (out / "journal-cat.log").write_text(journalctl(dirs, "-t", "imexctl", "-o", "cat"))
        (out / "journal-short-iso.log").write_text(journalctl(dirs, "-t", "imexctl", "-o", "short-iso"))
        (out / "journal-short.log").write_text(journalctl(dirs, "-t", "imexctl", "-o", "short"))
        if rsyslog_root is not None:
            _record_rsyslog(rsyslog_root, {**logs, "tray03": [*logs["tray03"], extra["tray03"][0][1]]}, out)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="record tests/data/whylog/ (root)")
    p.add_argument("--rsyslog", type=Path, metavar="DIR", help="a root where Debian's rsyslog package is unpacked")
    record(p.parse_args().rsyslog)
