"""SIGKILL at every step boundary: the next epilog or ``imexctl cleanup`` leaves the tray clean.

The prolog is killed at each of its steps; the epilog and ``cleanup`` are
killed, terminated, or paused and then killed at each of theirs.  After each,
``imexctl status`` tells the truth (what is left, stale or not) and
``cleanup --dry-run`` names exactly what the following ``cleanup`` removes.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from imexctl.commands.demo import Tray
from tests.faults import cycles
from tests.faults.rack import FaultRack

PROLOG_STEPS = ["start", "locked", "claimed", "files_written", "daemon_started", "ready", "channel_created"]


@pytest.mark.parametrize("step", PROLOG_STEPS)
@pytest.mark.parametrize("recover", ["epilog", "cleanup"])
def test_prolog_killed_at_each_step(make_rack: Callable[..., FaultRack], step: str, recover: str) -> None:
    """Tray 1's prolog dies at ``step``; recovery leaves nothing; the next job's prolog succeeds everywhere."""
    rack = make_rack(2, deadline_s=6)
    t1, t2 = rack.trays
    r1 = rack.start(t1, "prolog", 700, f"{step}=kill")
    r2 = rack.start(t2, "prolog", 700)
    res1, res2 = r1.result(), r2.result()
    assert res1.returncode == -9 and r1.steps()[-1] == step, res1.output
    assert res2.returncode in (0, 75), res2.output  # the peer: ready before the kill, or times out
    if recover == "epilog":
        assert [r.returncode for r in rack.run_all("epilog", 700)] == [0, 0]
    else:
        for t in rack.trays:
            done = rack.imexctl(
                t, "cleanup", "--force"
            )  # tray 2 set up its part and no epilog ran: a live job to plain cleanup
            assert done.returncode == 0, done.stdout + done.stderr
    assert rack.dirty() == []
    assert [r.returncode for r in rack.run_all("prolog", 701)] == [0, 0]
    assert [r.returncode for r in rack.run_all("epilog", 701)] == [0, 0]
    assert rack.dirty() == []


# ---------------------------------------------------------------- the epilog and cleanup killed at each of their steps

TEARDOWN_STEPS = ["start", "locked", "daemon_stopped", "channel_removed", "removed"]
ACTIONS = ["kill", "term", "pause_kill"]
JOB = 720


def faulted(rack: FaultRack, t: Tray, hook: str, step: str, action: str) -> None:
    """Run ``hook`` and end it at ``step``: SIGKILL or SIGTERM from itself, or paused there (holding the
    node lock past ``start``) and SIGKILLed by us; the kernel frees the lock."""
    if action == "pause_kill":
        run = rack.start(t, hook, JOB, f"{step}=pause")
        assert run.reached(step), run.result().output
        assert rack.lock_held(t) == (step != "start")
        run.proc.kill()
    else:
        run = rack.start(t, hook, JOB, f"{step}={action}")
    res = run.result()
    assert res.returncode == (-15 if action == "term" else -9), res.output
    assert run.steps()[-1] == step and not rack.lock_held(t), run.steps()


def truthful_status(rack: FaultRack, t: Tray) -> dict[str, Any]:
    """``imexctl status --json`` agrees with what is on the tray (cycles.status_lies); its data."""
    done = rack.imexctl(t, "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    st: dict[str, Any] = json.loads(done.stdout)["data"]
    assert cycles.status_lies(st, cycles.reality(t)) == [], st
    return st


def cleanup_as_dry_run_said(rack: FaultRack, t: Tray) -> dict[str, Any]:
    """``cleanup --dry-run`` then ``cleanup``: the run does and logs exactly the items the dry run named, and what
    each names is gone; its data."""
    dry, done = (rack.imexctl(t, "cleanup", "--json", *args) for args in (("--dry-run",), ()))
    assert dry.returncode == done.returncode == 0, dry.stdout + done.stdout + done.stderr
    dry_data, data = json.loads(dry.stdout)["data"], json.loads(done.stdout)["data"]
    assert cycles.items(dry_data["actions"]) == cycles.items(data["actions"]), (dry_data, data)
    assert dry_data["skipped"] == data["skipped"]
    logged = [json.loads(line) for line in (t.root / "var/log/imexctl.log").read_text().splitlines()]
    assert [r["actions"] for r in logged if r["event"] == "cleanup.done"][-2:] == [dry_data["actions"], data["actions"]]
    left = "\n".join(rack.leftovers())
    for item in cycles.items(data["actions"]):  # what each item names is gone: its path, or the job's daemon
        what = f"jobs/{JOB}/config.cfg" if item.startswith("stop daemon") else item.split()[-1]
        assert what not in left, (item, left)
    return dict(data)


def clean(rack: FaultRack, t: Tray) -> None:
    """Nothing left (no daemon, channel, file or held lock), status says so, and the job's epilog finds nothing."""
    assert rack.dirty() == []
    st = truthful_status(rack, t)
    assert (st["jobs"], st["channels"], st["stale"]) == ([], [], []), st
    res, run = rack.run(t, "epilog", JOB)
    assert res.returncode == 0 and run.steps() == ["start"], res.output


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("step", TEARDOWN_STEPS)
def test_epilog_killed_at_each_step(make_rack: Callable[..., FaultRack], step: str, action: str) -> None:
    """The epilog of a set-up job dies at ``step``: status tells what is left; cleanup (and, where the job was
    not yet marked ended, the epilog again) leaves nothing."""
    rack = make_rack(1, deadline_s=6)
    (t,) = rack.trays
    assert rack.run(t, "prolog", JOB)[0].returncode == 0
    faulted(rack, t, "epilog", step, action)
    st = truthful_status(rack, t)
    if step == "removed":  # everything was removed, the kill came after
        assert st["jobs"] == [] and st["stale"] == []
    elif step == "start":  # before the epilog marked its job ended: a live set-up domain, as design.md says
        assert [j["running"] for j in st["jobs"]] == [True] and st["stale"] == []
    else:
        assert [j["running"] for j in st["jobs"]] == [False], st
        assert f"job {JOB}: job no longer runs on this node" in st["stale"], st
    data = cleanup_as_dry_run_said(rack, t)
    if step == "start":  # plain cleanup keeps it; slurmd's epilog (or cleanup --force) is the recovery
        assert data["skipped"] and data["actions"] == [], data
        assert rack.run(t, "epilog", JOB)[0].returncode == 0
    clean(rack, t)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("step", TEARDOWN_STEPS)
def test_cleanup_killed_at_each_step(make_rack: Callable[..., FaultRack], step: str, action: str) -> None:
    """``imexctl cleanup`` of a dead prolog's domain dies at ``step``: status tells what is left, the next
    cleanup does what its dry run names and leaves nothing."""
    rack = make_rack(1, deadline_s=6)
    (t,) = rack.trays
    assert rack.run(t, "prolog", JOB, "channel_created=kill")[0].returncode == -9  # before set_up: a dead job
    faulted(rack, t, "cleanup", step, action)
    st = truthful_status(rack, t)
    assert (st["stale"] == []) == (step == "removed"), st
    cleanup_as_dry_run_said(rack, t)
    clean(rack, t)
