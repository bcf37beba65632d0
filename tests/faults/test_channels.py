"""Only the job's uid can open its channel; channels of gone jobs are removed (issue 10, "Channels").

The real prolog makes the channel on a simulated tray (a character device with
the IMEX major of the tray's fake ``/proc/devices``, owner ``SLURM_JOB_UID``,
mode ``0600``).  No NVIDIA driver is loaded here, so opening it can never
succeed: what tells the cases apart is *why* it fails.  ``EACCES`` is the
kernel's permission check refusing the caller; ``ENXIO``/``ENODEV`` means the
permission check passed and only the missing driver stopped the open.  Each
open runs in a child process under the uid and gid being tried.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import psutil
import pytest

from imexctl.commands.demo import Tray
from tests.faults.rack import FaultRack
from tests.support.racks import JOB_GID, JOB_UID

#: make_rack's job user and its group (no such account is needed); the lab user is 1501, its group 1502
LAB_UID, LAB_GID = 1501, 1502
NO_DRIVER = {errno.ENXIO, errno.ENODEV}

OPEN = """
import errno, os, sys, json
path = sys.argv[1]
try:
    st = os.stat(path)
except OSError as exc:
    print(json.dumps({"stat": errno.errorcode[exc.errno]})); sys.exit()
try:
    os.close(os.open(path, os.O_RDWR | os.O_NOFOLLOW))
    print(json.dumps({"stat": "ok", "open": "ok"}))
except OSError as exc:
    print(json.dumps({"stat": "ok", "open": errno.errorcode[exc.errno]}))
"""


def open_as(path: Path, uid: int, gid: int, groups: tuple[int, ...] = ()) -> dict[str, str]:
    """Try to open ``path`` read-write as ``uid``/``gid``: ``{"stat": ..., "open": ...}`` (errno names)."""
    done = subprocess.run(
        [sys.executable, "-c", OPEN, str(path)],
        user=uid,
        group=gid,
        extra_groups=list(groups),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd="/",
    )
    out: dict[str, str] = json.loads(done.stdout)
    return out


def channel_of(t: Tray) -> Path:
    chans = sorted((t.root / "dev/nvidia-caps-imex-channels").glob("channel*"))
    assert len(chans) == 1, chans
    return chans[0]


@pytest.fixture
def rack(make_rack: Callable[..., FaultRack]) -> FaultRack:
    """One tray whose directories other users may traverse (the rack's base is 0700 otherwise)."""
    r = make_rack(1)
    assert r.channels, "this machine cannot make device nodes"
    os.chmod(r.base, 0o755)
    return r


def test_only_the_jobs_uid_gets_past_the_permission_check(rack: FaultRack) -> None:
    """The job's uid gets ENXIO/ENODEV (allowed; no driver here); another uid, a uid in the job's group and
    the lab user are refused with EACCES although they can see the node."""
    t = rack.trays[0]
    assert rack.run(t, "prolog", 901)[0].returncode == 0
    chan = channel_of(t)
    st = os.lstat(chan)
    assert stat.S_ISCHR(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (JOB_UID, JOB_GID, 0o600)
    assert os.major(st.st_rdev) == 234 and chan.name == f"channel{os.minor(st.st_rdev)}"
    owner = open_as(chan, JOB_UID, JOB_GID)
    assert owner["stat"] == "ok" and owner["open"] in {errno.errorcode[e] for e in NO_DRIVER}
    for uid, gid, groups in [(4243, 4243, ()), (4243, JOB_GID, ()), (4244, 4244, (JOB_GID,)), (LAB_UID, LAB_GID, ())]:
        assert open_as(chan, uid, gid, groups) == {"stat": "ok", "open": "EACCES"}, (uid, gid, groups)
    assert rack.run(t, "epilog", 901)[0].returncode == 0
    assert not os.path.lexists(chan) and rack.dirty() == []


def test_channel_mode_setting_is_what_decides(rack: FaultRack) -> None:
    """Control for the test above: with [policy] channel_mode = 0666 the other uid passes the permission check
    too (ENXIO/ENODEV), so the EACCES above comes from the node's mode and owner, not from the path."""
    t = rack.trays[0]
    t.config.write_text(t.config.read_text().replace("[policy]\n", "[policy]\nchannel_mode = 0666\n"))
    assert rack.run(t, "prolog", 902)[0].returncode == 0
    assert open_as(channel_of(t), 4243, 4243)["open"] in {errno.errorcode[e] for e in NO_DRIVER}
    assert rack.run(t, "epilog", 902)[0].returncode == 0
    assert rack.dirty() == []


def test_epilog_removes_the_channel_of_a_job_whose_state_is_lost(rack: FaultRack) -> None:
    """state.json unreadable (truncated): the epilog still removes the job's computed channel and its directory."""
    t = rack.trays[0]
    assert rack.run(t, "prolog", 903)[0].returncode == 0
    chan = channel_of(t)
    (t.root / "run/imexctl/jobs/903/state.json").write_text('{"job_id": 9')
    assert rack.run(t, "epilog", 903)[0].returncode == 0
    assert not os.path.lexists(chan) and rack.dirty() == []


def test_cleanup_removes_the_channels_of_gone_jobs_but_channel0(rack: FaultRack) -> None:
    """A job that no longer runs here (no slurmstepd, its daemon died) and channel nodes no job claims (a
    crash, slurmd restarted): `cleanup --dry-run` names exactly what `cleanup` then removes; channel0 (shared
    by convention) stays."""
    t = rack.trays[0]
    assert rack.run(t, "prolog", 904)[0].returncode == 0
    # a set-up job whose epilog has not begun counts as running while its daemon lives: the daemon dies
    (daemon,) = [
        p
        for p in psutil.process_iter(["cmdline"])
        if f"{t.root}/run/imexctl/jobs/904/config.cfg" in (p.info["cmdline"] or [])
    ]
    daemon.kill()
    daemon.wait(5)
    own = channel_of(t)
    d = own.parent
    for minor in (0, 7, 1999):
        os.mknod(d / f"channel{minor}", stat.S_IFCHR | 0o600, os.makedev(234, minor))
        os.chown(d / f"channel{minor}", JOB_UID, JOB_UID)
    before = sorted(p.name for p in d.iterdir())
    dry = rack.imexctl(t, "cleanup", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    actions = json.loads(dry.stdout)["data"]["actions"]
    named = [a for a in actions if "channel" in a]
    assert named == [f"would remove channel {own}"] + [f"would remove stray channel {d}/channel{m}" for m in (7, 1999)]
    assert sorted(p.name for p in d.iterdir()) == before
    done = rack.imexctl(t, "cleanup", "--json")
    assert done.returncode == 0, done.stderr
    removed = [a for a in json.loads(done.stdout)["data"]["actions"] if "channel" in a]
    assert removed == [a.removeprefix("would ") for a in named]
    assert [p.name for p in d.iterdir()] == ["channel0"]
    os.unlink(d / "channel0")
    assert rack.dirty() == []
