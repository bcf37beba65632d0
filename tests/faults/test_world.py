"""The outside world fails (issue 10): the daemon, ``nvidia-imex-ctl``, ``systemctl``, ``/run``, ``/proc/devices``, the clock.

Real hooks on the simulator (:class:`FaultRack`) wherever a process shows it:
the simulated daemon crashes, never gets ready or hangs on stop; small fake
programs written here stand in for ``nvidia-imex-ctl`` and ``systemctl``
(absolute paths, through ``[commands]``) and hang, print garbage or binary
data, or never stop printing; the hook runs in a private mount namespace with
a tiny tmpfs (full, or read-only) over the tray's run directory.  A wall clock
that jumps cannot be shown by a process here (nothing may step this machine's
clock), so those cases run over ``FakeHost``.

Each case checks the documented exit code, a reason that names what was
wrong, and that nothing is left on the tray (``FaultRack.dirty()``).
"""

from __future__ import annotations

import configparser
import dataclasses
import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.commands import status
from imexctl.commands.demo import HookResult, Tray
from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import epilog
from imexctl.platform.errors import HealthTimeout
from imexctl.platform.host import RealHost
from tests.faults.rack import REPO, FaultRack, Run
from tests.simhelpers import wait_for
from tests.support.fakes import FakeGpu, FakeHost, job_env

MAX_OUT = "printed more than 4194304 bytes"


# ---------------------------------------------------------------- helpers


def configure(t: Tray, **sections: dict[str, object]) -> None:
    """Set keys in tray ``t``'s imexctl.conf."""
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(t.config.read_text())
    for section, keys in sections.items():
        if not cp.has_section(section):
            cp.add_section(section)
        for key, value in keys.items():
            cp.set(section, key, str(value))
    with t.config.open("w") as f:
        cp.write(f)
    t.config.chmod(0o644)


def records(t: Tray) -> list[dict[str, Any]]:
    """Every line of the tray's imexctl log."""
    log = t.root / "var/log/imexctl.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def last(t: Tray, event: str) -> dict[str, Any]:
    """The last log line of ``event`` on tray ``t``."""
    found = [r for r in records(t) if r["event"] == event]
    assert found, f"no {event} in {t.root}/var/log/imexctl.log"
    return found[-1]


def clean_output(r: HookResult) -> None:
    """What slurmd logs of a hook: JSON lines, ASCII only, whatever the commands printed."""
    for line in r.output.splitlines():
        assert line.isascii() and line.isprintable(), repr(line[:200])
        json.loads(line)


def program(rack: FaultRack, name: str, body: str) -> str:
    """Write an executable program under the rack (so a survivor shows in ``dirty()``): Python, unless ``body``
    starts with its own ``#!`` line; its path."""
    path = rack.base / "bin" / name
    path.write_text(("" if body.startswith("#!") else f"#!{sys.executable}\n") + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def one_tray(make_rack: Callable[..., FaultRack], deadline_s: float = 6, **sections: dict[str, object]) -> FaultRack:
    rack = make_rack(1, deadline_s=deadline_s)
    configure(rack.trays[0], **sections)
    return rack


def finish(rack: FaultRack, job_id: int) -> None:
    """The epilog after any failure exits 0 and the tray is clean."""
    t = rack.trays[0]
    r, _ = rack.run(t, "epilog", job_id)
    assert r.returncode == 0, r.output
    assert rack.dirty() == []


# ---------------------------------------------------------------- the daemon


def test_daemon_that_crashes_during_start_up_fails_the_prolog_at_once(make_rack: Callable[..., FaultRack]) -> None:
    """A daemon that dies while it starts: daemon_failed (69) long before the deadline, rolled back."""
    rack = one_tray(make_rack, deadline_s=60)
    rack.set_faults("slow_start=30\ncrash_after=0.3")
    t0 = time.monotonic()
    r, _ = rack.run(rack.trays[0], "prolog", 801)
    assert r.returncode == 69, r.output
    # a prolog that missed the crash would wait for its 60 s deadline; the crash comes 0.3 s after the start, and
    # the rest of the 30 s is the margin of a loaded machine
    assert time.monotonic() - t0 < 30
    done = last(rack.trays[0], "prolog.done")
    assert done["error_code"] == "daemon_failed" and "the IMEX daemon exited during start-up" in done["reason"]
    clean_output(r)
    assert rack.dirty() == []
    finish(rack, 801)


def test_daemon_never_ready_and_deaf_to_sigterm_is_killed_by_the_roll_back(
    make_rack: Callable[..., FaultRack],
) -> None:
    """Never READY, and it ignores SIGTERM: the prolog fails at its deadline (not_ready, 75) and its roll-back
    SIGKILLs the daemon after stop_timeout_s + kill_grace_s, so nothing is left."""
    rack = one_tray(make_rack, deadline_s=1.5, daemon={"stop_timeout_s": 1, "kill_grace_s": 1})
    rack.set_faults("never_ready\nignore_sigterm")
    r, _ = rack.run(rack.trays[0], "prolog", 802)
    assert r.returncode == 75, r.output
    t = rack.trays[0]
    assert last(t, "prolog.done")["error_code"] == "not_ready"
    assert last(t, "imex.daemon.killed")["pids"]
    assert rack.dirty() == []
    finish(rack, 802)


def test_daemon_slow_to_stop_is_waited_for_not_killed(make_rack: Callable[..., FaultRack]) -> None:
    """A daemon that takes 0.8 s to stop, within stop_timeout_s: the epilog waits, kills nothing, exits 0."""
    rack = one_tray(make_rack, daemon={"stop_timeout_s": 30, "kill_grace_s": 1})
    rack.set_faults("stop_delay=0.8")
    t = rack.trays[0]
    assert rack.run(t, "prolog", 803)[0].returncode == 0
    r, _ = rack.run(t, "epilog", 803)
    assert r.returncode == 0, r.output
    # waited for the daemon's exit (0.8 s), not to stop_timeout_s (30 s): the rest is a loaded machine's margin
    assert 0.8 <= last(t, "epilog.done")["duration_s"] < 15
    assert not [x for x in records(t) if x["event"] == "imex.daemon.killed"]
    assert rack.dirty() == []


@pytest.mark.parametrize("fault", ["ignore_sigterm", "stop_delay=60"])
def test_daemon_hung_on_stop_is_killed_after_the_grace_period(make_rack: Callable[..., FaultRack], fault: str) -> None:
    """A daemon that never stops on SIGTERM: the epilog SIGKILLs it after stop_timeout_s + kill_grace_s
    (logged as imex.daemon.killed with its pid), exits 0 and leaves nothing."""
    rack = one_tray(make_rack, daemon={"stop_timeout_s": 1, "kill_grace_s": 1})
    rack.set_faults(fault)
    t = rack.trays[0]
    assert rack.run(t, "prolog", 804)[0].returncode == 0
    pid = status_of(rack, t)["jobs"][0]["daemon"]["pid"]
    r, _ = rack.run(t, "epilog", 804)
    assert r.returncode == 0, r.output
    assert last(t, "imex.daemon.killed")["pids"] == [pid]
    # killed after this tray's stop_timeout_s + kill_grace_s (2 s), not the defaults' 15 + 5 s (tests/imex/
    # test_daemon.py holds the escalation on a fake clock); the rest of the 12 s is a loaded machine's margin
    assert 2.0 <= last(t, "epilog.done")["duration_s"] < 12
    assert rack.dirty() == []


def status_of(rack: FaultRack, t: Tray) -> dict[str, Any]:
    done = rack.imexctl(t, "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    data: dict[str, Any] = json.loads(done.stdout)["data"]
    return data


# ---------------------------------------------------------------- nvidia-imex-ctl

CTL: dict[str, tuple[str, str]] = {
    # name: (program body, what the prolog's reason must say). Those that answer are shell scripts: they answer
    # in milliseconds, as the real (compiled) nvidia-imex-ctl does, where a Python stand-in's start-up can outlast
    # the prolog's last probe (at least 0.2 s) on a loaded machine, and its reason would be "no answer" instead
    "hangs": ("import time\ntime.sleep(3600)\n", "no answer within"),
    "garbage": ("#!/bin/sh\nprintf 'Segmentation fault (core dumped)\\nlorem ipsum\\n'\n", "unknown state"),
    "binary": (
        "#!/bin/sh\nprintf '\\000\\033[2J\\033]0;pwned\\007\\377\\376'\nexec head -c 4096 /dev/urandom\n",
        "unknown state",
    ),
    "endless": ("#!/bin/sh\nexec yes READY\n", MAX_OUT),
}


@pytest.mark.parametrize("kind", list(CTL))
def test_ctl_that_fails_ends_the_prolog_at_its_deadline(make_rack: Callable[..., FaultRack], kind: str) -> None:
    """nvidia-imex-ctl hangs, prints garbage or binary data, or never stops printing: every call is bounded
    (ctl_timeout_s, 4 MiB), the prolog fails at its deadline (not_ready, 75) saying what the ctl did, slurmd's
    log gets clean JSON lines, no ctl process survives, and the roll-back leaves nothing."""
    rack = make_rack(1, deadline_s=2)
    body, says = CTL[kind]
    t = rack.trays[0]
    configure(t, commands={"nvidia_imex_ctl": program(rack, f"ctl-{kind}", body)}, readiness={"ctl_timeout_s": 0.5})
    t0 = time.monotonic()
    r, _ = rack.run(t, "prolog", 811)
    assert r.returncode == 75, r.output
    # every ctl call is bounded: without it the prolog would wait an hour ("hangs") or forever ("endless"). That
    # the 2 s deadline cuts the last call short is tests/hooks/test_readiness.py's (on a fake clock): here the
    # bound only tells a bounded prolog from a hung one, whatever the machine's load
    assert time.monotonic() - t0 < 30
    done = last(t, "prolog.done")
    assert done["error_code"] == "not_ready" and says in done["reason"], done["reason"]
    assert len(done["reason"]) < 2000
    clean_output(r)
    assert rack.dirty() == []
    finish(rack, 811)


def test_status_with_a_hanging_ctl_answers_in_bounded_time(make_rack: Callable[..., FaultRack]) -> None:
    """During a job, a ctl that hangs: `imexctl status` still answers (exit 0) within ctl_timeout_s, the
    domain shown as unknown with the reason."""
    rack = make_rack(1)
    t = rack.trays[0]
    assert rack.run(t, "prolog", 812)[0].returncode == 0
    configure(
        t, commands={"nvidia_imex_ctl": program(rack, "ctl-hangs", CTL["hangs"][0])}, readiness={"ctl_timeout_s": 1}
    )
    t0 = time.monotonic()
    st = status_of(rack, t)
    assert time.monotonic() - t0 < 30  # a status that waited on this ctl would hang for an hour
    assert "no answer within 1s" in st["jobs"][0]["domain"]["error"]
    finish(rack, 812)


# ---------------------------------------------------------------- systemctl

SYSTEMCTL = """\
import json, os, signal, subprocess, sys, time
JOBS, IMEX, HERE = {jobs!r}, {imex!r}, {here!r}
args = sys.argv[1:]
with open(os.path.join(HERE, "calls"), "a") as f:
    f.write(json.dumps(args) + "\\n")
verb, units = args[0], [a for a in args[1:] if not a.startswith("-")]
modes = dict(line.split("=", 1) for line in open(os.path.join(HERE, "mode")).read().split())
mode = modes.get(verb, "ok")
if mode == "hang":
    time.sleep(3600)
if mode == "garbage":
    sys.stdout.buffer.write(b"\\x00\\x1b[2J\\xff\\xfe no unit here =\\n" * 64)
    sys.exit(0)
if mode == "endless":
    while True:
        sys.stdout.write("ActiveState=active\\n" * 4096)
def job(unit):
    return unit.split("@", 1)[1].split(".", 1)[0]
pidfile = lambda unit: os.path.join(HERE, unit + ".pid")
if verb == "show":
    for u in units:
        cfg = f"{{JOBS}}/{{job(u)}}/config.cfg" if "@" in u else ""
        load, start = ("loaded", f"{{{{ path={{IMEX}} ; argv[]={{IMEX}} -c {{cfg}} ; ignore_errors=no }}}}") if cfg else ("not-found", "")
        print(f"Id={{u}}\\nLoadState={{load}}\\nActiveState=inactive\\nSubState=dead\\nMainPID=0\\nExecStart={{start}}\\n")
elif verb == "start":
    p = subprocess.Popen([IMEX, "-c", f"{{JOBS}}/{{job(units[0])}}/config.cfg"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(pidfile(units[0]), "w").write(str(p.pid))
elif verb == "stop" and os.path.exists(pidfile(units[0])):
    pid = int(open(pidfile(units[0])).read())
    os.kill(pid, signal.SIGTERM)
    while os.path.exists(f"/proc/{{pid}}") and open(f"/proc/{{pid}}/stat").read().split()[2] != "Z":
        time.sleep(0.05)
    os.unlink(pidfile(units[0]))
"""


@dataclasses.dataclass
class FakeSystemctl:
    """A fake ``systemctl`` that runs the simulator for ``start``; ``mode`` makes one verb fail."""

    here: Path

    def mode(self, **verbs: str) -> None:
        (self.here / "mode").write_text("".join(f"{v}={m}\n" for v, m in verbs.items()))

    def verbs(self) -> list[str]:
        path = self.here / "calls"
        return [json.loads(line)[0] for line in path.read_text().splitlines()] if path.exists() else []


def systemd_tray(make_rack: Callable[..., FaultRack]) -> tuple[FaultRack, FakeSystemctl]:
    rack = make_rack(1)
    t = rack.trays[0]
    here = rack.base / "systemctl.d"
    here.mkdir()
    body = SYSTEMCTL.format(jobs=str(t.root / "run/imexctl/jobs"), imex=rack.bins["nvidia_imex"], here=str(here))
    fake = FakeSystemctl(here)
    fake.mode()
    configure(
        t,
        commands={"systemctl": program(rack, "systemctl", body)},
        daemon={"backend": "systemd", "start_timeout_s": 1, "stop_timeout_s": 1},
    )
    return rack, fake


def test_fake_systemctl_runs_a_job(make_rack: Callable[..., FaultRack]) -> None:
    """The fake itself: with no fault the systemd backend starts, stops and resets the job's unit."""
    rack, fake = systemd_tray(make_rack)
    t = rack.trays[0]
    assert rack.run(t, "prolog", 820)[0].returncode == 0
    assert rack.run(t, "epilog", 820)[0].returncode == 0
    # stop, then show (systemd's Result: did it SIGKILL after the stop timeout?), then reset-failed
    assert fake.verbs() == ["show", "start", "stop", "show", "reset-failed"]
    assert rack.dirty() == []


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        pytest.param({"start": "hang"}, "systemctl start imexctl-imex@821.service: {prog}: no answer within 1s", id="start-hangs"),
        pytest.param({"show": "garbage"}, "systemctl show imexctl-imex@821.service: no properties of the unit in", id="show-binary-garbage"),
        pytest.param({"show": "endless"}, f"{{prog}}: {MAX_OUT}", id="show-never-ends"),
    ],
)  # fmt: skip
def test_systemctl_that_fails_fails_the_prolog_cleanly(
    make_rack: Callable[..., FaultRack], mode: dict[str, str], says: str
) -> None:
    """systemctl hangs, prints binary garbage or never stops printing: the prolog fails with exit 69 naming
    the verb and the unit, stops the unit anyway in its roll-back, and leaves nothing (no systemctl either)."""
    rack, fake = systemd_tray(make_rack)
    fake.mode(**mode)
    t = rack.trays[0]
    r, _ = rack.run(t, "prolog", 821)
    clean_output(r)
    assert r.returncode == 69, r.output
    assert says.format(prog=rack.base / "bin/systemctl") in last(t, "prolog.done")["reason"]
    if "start" in mode:
        assert fake.verbs() == ["show", "start", "stop", "show", "reset-failed"]
    assert rack.dirty() == []
    finish(rack, 821)


def test_systemctl_stop_that_hangs_leaves_the_kill_to_the_epilog(make_rack: Callable[..., FaultRack]) -> None:
    """systemctl stop hangs: after stop_timeout_s + 5 the epilog kills the job's daemon itself (SIGTERM, grace),
    exits 0 and reports the failed stop among its actions."""
    rack, fake = systemd_tray(make_rack)
    t = rack.trays[0]
    assert rack.run(t, "prolog", 822)[0].returncode == 0
    fake.mode(stop="hang")
    r, _ = rack.run(t, "epilog", 822)
    assert r.returncode == 0, r.output
    actions = last(t, "epilog.done")["actions"]
    assert any("systemctl stop imexctl-imex@822.service" in a and "no answer within 6s" in a for a in actions), actions
    assert rack.dirty() == []


# ---------------------------------------------------------------- /run full or read-only

FILL = '/usr/bin/dd if=/dev/zero of="$RUN/filler" bs=4k 2>/dev/null || true'
RUN_CASES = {
    # name: (set-up inside the namespace, files left in the run directory, exit, what the reason says)
    "full": (FILL, ["filler", "jobs", "lock"], 71, "jobs/831/nodes_config.cfg: No space left on device"),
    "jobs-read-only": (
        (
            '/usr/bin/mkdir "$RUN/jobs" && /usr/bin/mount --bind "$RUN/jobs" "$RUN/jobs" '
            '&& /usr/bin/mount -o remount,bind,ro "$RUN/jobs"'
        ),
        ["jobs", "lock"],
        71,
        "jobs/831: Read-only file system",
    ),
    "read-only": ('/usr/bin/mount -o remount,ro "$RUN"', [], 71, "cannot open the node lock {run}/lock: Read-only file system"),
}  # fmt: skip

NS_SCRIPT = """set -e
/usr/bin/mount -t tmpfs -o size=64k,mode=0755 imexctl-test "$RUN"
{setup}
set +e
"$@"
rc=$?
/usr/bin/find "$RUN" -mindepth 1 -maxdepth 1 -printf '%P\\n' | /usr/bin/sort > "$LISTING"
exit $rc
"""


def start_in_namespace(rack: FaultRack, t: Tray, job_id: int, setup: str, faults: str = "") -> tuple[Run, Path]:
    """The prolog under the fault driver, in a private mount namespace with a 64 KiB tmpfs on the run dir.

    Returns the run and the file that will list the run directory as the hook left it (inside the namespace).
    """
    FaultRack.runs += 1
    fdir = rack.base / f"ns{FaultRack.runs}"
    fdir.mkdir()
    run_dir = t.root / "run/imexctl"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = rack.job_env(t, job_id, "prolog")
    env.update(PYTHONPATH=str(REPO), IMEXCTL_FAULTS=faults, IMEXCTL_FAULT_DIR=str(fdir))
    env.update(RUN=str(run_dir), LISTING=str(fdir / "listing"))
    script = NS_SCRIPT.format(setup=setup)
    argv = ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
    proc = subprocess.Popen(
        [*argv, sys.executable, "-m", "tests.faults.driver", "prolog"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    return Run(t, proc, fdir), fdir / "listing"


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the file system refuses; the errno it refused with."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        return exc.errno or 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_run_directory_full_or_read_only(make_rack: Callable[..., FaultRack], case: str) -> None:
    """/run full or read-only when a file is written: file_failed (71) naming the file, and inside the
    namespace nothing of the job is left (no job directory, no temporary file)."""
    setup, left, code, says = RUN_CASES[case]
    rack = make_rack(1)
    t = rack.trays[0]
    run, listing = start_in_namespace(rack, t, 831, setup)
    r = run.result()
    assert r.returncode == code, r.output
    done = last(t, "prolog.done")
    assert done["error_code"] == "file_failed" and says.format(run=t.root / "run/imexctl") in done["reason"], done
    assert listing.read_text().split() == left
    assert not (t.root / "var/log/nvidia-imex.log").exists()  # failed before any daemon started
    clean_output(r)
    assert rack.dirty() == []


def test_run_directory_fills_up_after_the_daemon_started(make_rack: Callable[..., FaultRack]) -> None:
    """/run fills up between the job's files and the daemon's pid file: the daemon has started, the pid file
    cannot be written (71, naming daemon.pid), and the roll-back finds the daemon by its command line and stops it."""
    rack = make_rack(1)
    t = rack.trays[0]
    run, listing = start_in_namespace(rack, t, 832, "", faults="files_written=pause")
    assert run.reached("files_written"), run.result().output
    pid = int((run.dir / "files_written.reached").read_text())
    inside = Path(f"/proc/{pid}/root") / str(t.root / "run/imexctl").lstrip("/")
    assert sorted(os.listdir(inside / "jobs/832")) == ["config.cfg", "nodes_config.cfg", "state.json"]
    assert fill(inside / "filler") == errno.ENOSPC
    run.release("files_written")
    r = run.result()
    assert r.returncode == 71, r.output
    assert "jobs/832/daemon.pid: No space left on device" in last(t, "prolog.done")["reason"]
    assert (t.root / "var/log/nvidia-imex.log").exists()  # the daemon did start
    assert listing.read_text().split() == ["filler", "jobs", "lock"]
    assert rack.dirty() == []


# ---------------------------------------------------------------- /proc/devices


@pytest.mark.parametrize(
    ("devices", "says"),
    [
        pytest.param("Character devices:\n195 nvidia\n235 nvidia-caps\nBlock devices:\n  8 sd\n",
                     "{path} has no nvidia-caps-imex-channels entry", id="no-entry"),
        pytest.param("Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n236 nvidia-caps-imex-channels\n"
                     "Block devices:\n", "{path}: nvidia-caps-imex-channels listed 2 times (majors 234, 236)", id="two"),
        pytest.param("", "{path}: no 'Character devices:' section", id="empty"),
    ],
)  # fmt: skip
def test_proc_devices_without_one_imex_entry(make_rack: Callable[..., FaultRack], devices: str, says: str) -> None:
    """The tray's /proc/devices has no IMEX channel entry, or two: device_failed (71) naming the file,
    before any file is written or daemon started."""
    rack = make_rack(1)
    t = rack.trays[0]
    (t.root / "proc/devices").write_text(devices)
    r, _ = rack.run(t, "prolog", 841)
    assert r.returncode == 71, r.output
    done = last(t, "prolog.done")
    assert done["error_code"] == "device_failed"
    assert done["reason"].startswith(says.format(path=t.root / "proc/devices")), done["reason"]
    assert not (t.root / "var/log/nvidia-imex.log").exists() and not (t.root / "run/imexctl/jobs/841").exists()
    finish(rack, 841)


# ---------------------------------------------------------------- the clock


class JumpyClock(FakeHost):
    """A FakeHost whose wall clock jumps a day forward or back at every reading; monotonic time is untouched."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.readings = 0

    def time(self) -> float:
        self.readings += 1
        return super().time() + (86400.0 if self.readings % 2 else -86400.0) * self.readings


def _hosts(**kw: Any) -> tuple[FakeHost, FakeHost]:
    addresses = {"gb01": ["10.0.0.1"], "gb02": ["10.0.0.2"]}
    return FakeHost(addresses=addresses, **kw), JumpyClock(addresses=addresses, **kw)


def _runtime(host: FakeHost, s: Settings) -> Runtime:
    return Runtime(host, FakeGpu(), s, structlog.get_logger())


def test_readiness_deadline_ignores_a_jumping_wall_clock(make_settings: Callable[..., Settings]) -> None:
    """A domain that is never ready: with the wall clock jumping by days the wait is exactly as long, with
    as many probes, as with a steady one (every deadline is on the monotonic clock)."""
    s = make_settings(readiness={"deadline_s": 5})
    waits = []
    for host in _hosts(ready_after=10**6):
        with pytest.raises(HealthTimeout) as info:
            prolog(job_env(), _runtime(host, s))
        waits.append((info.value.waited_s, info.value.attempts, host.slept))
        epilog(job_env(), _runtime(host, s))
    assert waits[0] == waits[1] and 4.5 <= waits[0][0] <= 5.0
    assert isinstance(host, JumpyClock) and host.readings > 0


def test_prolog_and_epilog_succeed_under_a_jumping_wall_clock(make_settings: Callable[..., Settings]) -> None:
    """The same run, whatever the wall clock does: ready after the same probes, torn down after the same waits."""
    s = make_settings()
    runs = []
    for host in _hosts(ready_after=4, daemon_ignores_sigterm=True):
        done = prolog(job_env(), _runtime(host, s))
        epilog(job_env(), _runtime(host, s))
        runs.append((done.duration_s, host.slept, host.signals))
        assert done.ok and not [p for p in host.procs.values() if p.alive]
    assert runs[0] == runs[1] and runs[0][2]  # the same waits, and the daemon deaf to SIGTERM was killed
    assert isinstance(host, JumpyClock) and host.readings > 0  # the wall clock was read, and jumped


def test_status_uptime_is_on_the_boot_clock_and_never_negative(
    make_settings: Callable[..., Settings], root: Path
) -> None:
    """Uptime counts from the daemon's start on the boot clock (not the wall clock), and a start time
    that lies ahead of now (clock skew between readings) shows 0, never a negative uptime."""
    s = make_settings()
    host = JumpyClock(addresses={"gb01": ["10.0.0.1"], "gb02": ["10.0.0.2"]})
    prolog(job_env(), _runtime(host, s))
    host.sleep(12.5)
    assert status.collect(_runtime(host, s), "gb01").data()["jobs"][0]["daemon"]["uptime_s"] == 12.5
    proc = next(p for p in host.procs.values() if p.alive)
    proc.info = proc.info._replace(create_time=host.since_boot() + 3600)
    job = status.collect(_runtime(host, s), "gb01").data()["jobs"][0]
    assert job["daemon"]["uptime_s"] == 0.0
    epilog(job_env(), _runtime(host, s))


def test_realhost_knows_a_process_by_its_boot_relative_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """RealHost identifies a process by its start in seconds since boot (/proc/<pid>/stat), so a wall clock
    that is stepped (psutil's boot time moves with it) does not make a live daemon look gone."""
    import psutil

    host = RealHost()
    before = host.since_boot()
    child = subprocess.Popen(["/bin/sleep", "30"])
    try:
        # the child shows its command line once it has exec'd sleep: waited for, however loaded the machine
        info = wait_for(
            lambda: next((p for p in host.processes_with_arg("30") if p.pid == child.pid), None),
            what="the child to exec /bin/sleep",
        )
        # started between the two readings of the boot clock (its start is kept in clock ticks: 10 ms)
        assert before - 0.01 <= info.create_time <= host.since_boot()
        assert host.is_alive(info)
        ps_linux = getattr(psutil, "_pslinux", None)
        if ps_linux is not None and hasattr(ps_linux, "boot_time"):
            stepped = ps_linux.boot_time() + 3600.0
            monkeypatch.setattr(ps_linux, "boot_time", lambda: stepped)
            monkeypatch.setattr(psutil, "boot_time", lambda: stepped, raising=False)
        assert host.is_alive(info) and host._info(child.pid) == info
    finally:
        child.kill()
        child.wait()
    assert not host.is_alive(info)
