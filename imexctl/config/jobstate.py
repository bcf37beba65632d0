"""``state.json``: the one schema of what a prolog leaves for each job on a tray.

The prolog writes a :class:`JobState` into ``<run_dir>/jobs/<job id>/state.json``
(:mod:`imexctl.hooks.state`); the hooks, ``status``, ``cleanup``, ``doctor`` and
``health`` read it back whole, and the job's own user (the TaskProlog and the
enroot hook, :mod:`imexctl.channels.job`) reads its channel from it.  Every
reader decodes it here (:func:`decode`), each field checked by the kind this
module gives it, so the file's field names and their meaning are written once.
Fields a reader does not know (a newer version's) are left alone; a field
missing that has a default (an older version's file) takes it.

Light enough for the job's side: it imports only :mod:`imexctl.platform` (``Record``)
(``json`` when it reads or writes).
"""

from __future__ import annotations

from imexctl.platform import Record

# typing is not imported at run time: the job's side imports this module at every task start
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["CHANNEL_FIELDS", "JobState", "StateInvalid", "channel_of", "decode", "encode"]


class JobState(Record):
    """What a prolog set up for one job on this node (``<job dir>/state.json``)."""

    job_id: int
    node: str
    uid: int
    gid: int
    user: str
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    port: int
    backend: str
    channel_minor: int | None
    channel_path: str
    created: float
    cmd_port: int = 0
    #: when the prolog finished setting up (0: it did not, or not yet): the domain may be in use
    set_up: float = 0.0
    #: when the job's epilog started tearing it down here (0: it did not): the job has ended on this node
    ended: float = 0.0
    #: the run of the job that set it up: its restart count and start time as slurmd gave them (None: not said)
    restarts: int | None = None
    start_time: int | None = None
    #: by when the epilog that began at ``ended`` has finished here at the latest: every wait it makes from its
    #: mark on, with the settings it read (0: not recorded, as by an older version's epilog)
    epilog_deadline: float = 0.0


#: each field's kind: ``id`` (a whole number, 0 or more), ``id?`` (the same, or null), ``text``, ``texts`` (a list
#: of texts), ``time`` (seconds, 0 or more); in :class:`JobState`'s order (tests/config/test_jobstate.py)
KINDS = {
    "job_id": "id",
    "node": "text",
    "uid": "id",
    "gid": "id",
    "user": "text",
    "nodes": "texts",
    "addresses": "texts",
    "port": "id",
    "backend": "text",
    "channel_minor": "id?",
    "channel_path": "text",
    "created": "time",
    "cmd_port": "id",
    "set_up": "time",
    "ended": "time",
    "restarts": "id?",
    "start_time": "id?",
    "epilog_deadline": "time",
}
#: what the job's own user reads: the owner and the channel
CHANNEL_FIELDS = ("uid", "channel_minor", "channel_path")


class StateInvalid(ValueError):
    """``state.json`` is not what a prolog writes; ``str()`` says what, in one line (the job's side shows it)."""


def encode(state: JobState) -> str:
    """The file's text: one JSON object, the fields by name."""
    import json

    return json.dumps(state._asdict(), indent=1) + "\n"


def decode(data: str | bytes) -> JobState:
    """The state a prolog wrote, every field checked by its kind.

    Raises:
        StateInvalid: not JSON, a field missing (without a default) or of another kind.
    """
    fields = _fields(data, tuple(KINDS))
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}  # texts: a tuple each
    return JobState(**values)  # type: ignore[arg-type]  # each value checked by its kind


def channel_of(data: str | bytes) -> tuple[int, int | None, str]:
    """``(uid, channel_minor, channel_path)``: the job's owner and channel, the only fields its user reads.

    Raises:
        StateInvalid: as :func:`decode`, for these three fields alone.
    """
    fields = _fields(data, CHANNEL_FIELDS)
    return fields["uid"], fields["channel_minor"], fields["channel_path"]  # type: ignore[return-value]


def _fields(data: str | bytes, names: Sequence[str]) -> dict[str, object]:
    """The fields ``names`` of the JSON object in ``data``, each of its kind (defaults for those left out)."""
    import json

    try:
        found = json.loads(data)
    except ValueError:
        raise StateInvalid("state.json is not JSON") from None
    obj = found if isinstance(found, dict) else {}
    defaults = JobState._field_defaults
    out = {name: obj.get(name, defaults.get(name)) for name in names if name in obj or name in defaults}
    if len(out) < len(names) or not all(_shaped(KINDS[name], value) for name, value in out.items()):
        raise StateInvalid(f"state.json lacks {_either(names)}")
    numbers = [name for name in names if KINDS[name] in ("id", "id?", "time")]
    if not all(_counted(out[name]) for name in numbers):
        raise StateInvalid(f"state.json has a negative or boolean {_either(numbers)}")
    return out


def _shaped(kind: str, value: object) -> bool:
    """Of the JSON type ``kind`` is written as (a boolean passes for a number here: :func:`_counted` refuses it)."""
    if kind == "text":
        return isinstance(value, str)
    if kind == "texts":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "time":
        return isinstance(value, (int, float))
    return isinstance(value, int) or (kind == "id?" and value is None)


def _counted(value: object) -> bool:
    """A number that is no boolean and not below 0, or null."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)


def _either(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
