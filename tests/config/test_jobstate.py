"""``state.json`` has one schema: the prolog writes it, the hooks and the job's own user read it, all through it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from imexctl.config import jobstate
from imexctl.config.jobstate import JobState

PACKAGE = Path(__file__).resolve().parents[2] / "imexctl"
STATE = JobState(42, "gb01", 1000, 1001, "alice", ("gb01", "gb02"), ("10.0.0.1", "10.0.0.2"), 61042, "exec", 43,
                 "/dev/nvidia-caps-imex-channels/channel43", 5.5, 62042, 6.0, 9.0, 0, 1796434523, 184.5)  # fmt: skip


def test_every_field_has_its_kind_in_order() -> None:
    assert tuple(jobstate.KINDS) == JobState._fields
    assert set(jobstate.CHANNEL_FIELDS) <= set(JobState._fields)


def test_what_the_prolog_writes_reads_back_the_same() -> None:
    text = jobstate.encode(STATE)
    assert jobstate.decode(text) == STATE and jobstate.decode(text.encode()) == STATE
    assert jobstate.channel_of(text) == (1000, 43, "/dev/nvidia-caps-imex-channels/channel43")


def test_an_older_file_takes_the_defaults_and_a_newer_ones_fields_are_left_alone() -> None:
    """A file without the fields added since (cmd_port, marks, the run, the epilog's deadline) reads with their
    defaults; a field this version does not know is no reason to lose the job's state."""
    data = STATE._asdict()
    for late in ("cmd_port", "set_up", "ended", "restarts", "start_time", "epilog_deadline"):
        del data[late]
    old = jobstate.decode(json.dumps({**data, "from_a_newer_version": 1}))
    assert old == STATE._replace(cmd_port=0, set_up=0.0, ended=0.0, restarts=None, start_time=None, epilog_deadline=0.0)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"uid": "1000"}, "lacks"),
        ({"nodes": "gb01"}, "lacks"),
        ({"nodes": ["gb01", 2]}, "lacks"),
        ({"channel_minor": 1.5}, "lacks"),
        ({"created": "now"}, "lacks"),
        ({"job_id": None}, "lacks"),
        ({"uid": True}, "negative or boolean"),
        ({"port": -1}, "negative or boolean"),
        ({"ended": -2.0}, "negative or boolean"),
        ({"epilog_deadline": "soon"}, "lacks"),
        ({"epilog_deadline": -1.0}, "negative or boolean"),
    ],
)
def test_a_field_of_another_kind_is_refused(change: dict[str, object], why: str) -> None:
    with pytest.raises(jobstate.StateInvalid, match=why):
        jobstate.decode(json.dumps({**STATE._asdict(), **change}))


def test_a_file_that_is_no_state_is_refused_saying_what() -> None:
    with pytest.raises(jobstate.StateInvalid, match="is not JSON"):
        jobstate.decode('{"job_id": 4')
    with pytest.raises(jobstate.StateInvalid, match="lacks uid, channel_minor or channel_path"):
        jobstate.channel_of("[]")
    with pytest.raises(jobstate.StateInvalid, match="negative or boolean uid or channel_minor"):
        jobstate.channel_of('{"uid": 0, "channel_minor": -3, "channel_path": "/dev/null"}')
    assert jobstate.channel_of('{"uid": 7, "channel_minor": null, "channel_path": ""}') == (7, None, "")


@pytest.mark.parametrize("module", ["hooks/state.py", "channels/job.py"])
def test_no_reader_names_the_files_fields_itself(module: str) -> None:
    """The hooks' reader and the job's side know no field of state.json by name: the schema does."""
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    slots = {
        id(c)
        for a in ast.walk(tree)
        if isinstance(a, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in a.targets)
        for c in ast.walk(a.value)
    }  # a class's own attribute names
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names -= {n.value for n in ast.walk(tree) if id(n) in slots and isinstance(n, ast.Constant)}
    assert not names & set(JobState._fields)
