"""The one envelope of every ``--json`` output, and the typed results it carries.

Each command with ``--json`` (``status``, ``cleanup``, ``doctor``,
``topology``, ``netcheck``, ``health``, ``why``) builds a typed, immutable
result (a :class:`Result`: a record of records) and hands it here; only here
does it become JSON, through its own :meth:`Result.data`.  The envelope is the
same for all of them and carries :data:`RESULT_VERSION`::

    {"imexctl_result_version": "1", "status": "ok" | "error", "exit_code": N,
     "data": <the command's result, or null>, "errors": [{"code": ..., "message": ...}]}

A result's ``data()`` is the JSON boundary: the one place where a record
becomes plain values (:data:`Json`), never handed back to imexctl's own code
(metrics and the live gauges read the records, not their JSON).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol, Union

if TYPE_CHECKING:
    from imexctl.platform.errors import ImexctlError

__all__ = ["RESULT_VERSION", "Json", "JsonObject", "Result", "envelope", "print_json"]

#: bumped when a field of the envelope, or of a command's ``data``, changes meaning (docs/exit-codes.md)
RESULT_VERSION: Final = "1"

#: a JSON value: what a result's :meth:`Result.data` returns
Json = Union[None, bool, int, float, str, Sequence["Json"], Mapping[str, "Json"]]
#: a JSON object
JsonObject = Mapping[str, Json]


class Result(Protocol):
    """A command's typed result: it says itself as JSON (the ``data`` of the envelope)."""

    def data(self) -> Json:
        """The result as plain JSON values, keys in the order they are printed."""
        ...


def envelope(result: Result | None, errors: Sequence[ImexctlError] = ()) -> JsonObject:
    """The envelope around ``result`` (None: no result, the command failed before it had one) and the errors."""
    return {
        "imexctl_result_version": RESULT_VERSION,
        "status": "error" if errors else "ok",
        "exit_code": int(errors[0].exit_code) if errors else 0,
        "data": None if result is None else result.data(),
        "errors": [{"code": e.code, "message": str(e)} for e in errors],
    }


def print_json(result: Result | None, errors: Sequence[ImexctlError] = (), indent: int | None = 2) -> None:
    """Print the envelope (:func:`envelope`) on stdout, as one JSON document."""
    import json

    print(json.dumps(envelope(result, errors), indent=indent))
