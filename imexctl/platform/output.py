"""The JSON envelope of every ``--json`` output (status, cleanup, doctor, topology): one renderer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from imexctl.platform.errors import ImexctlError

__all__ = ["RESULT_VERSION", "print_json"]

#: bumped when a field of the envelope changes meaning (docs/exit-codes.md)
RESULT_VERSION = "1"


def print_json(data: Any, errors: Sequence[ImexctlError] = (), indent: int | None = 2) -> None:
    """Print ``data`` (already plain: records render themselves) and the errors, in the envelope, on stdout."""
    import json

    out = {
        "imexctl_result_version": RESULT_VERSION,
        "status": "error" if errors else "ok",
        "exit_code": int(errors[0].exit_code) if errors else 0,
        "data": data,
        "errors": [{"code": e.code, "message": str(e)} for e in errors],
    }
    print(json.dumps(out, indent=indent))
