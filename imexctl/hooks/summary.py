"""The summary lines of a hook run, field by field in their order: ``prolog.done``, ``epilog.done``, a skip.

One renderer of their fields for the hooks' fast path (:mod:`imexctl.hooks.entry`),
which writes them itself, and for the records of :mod:`imexctl.hooks.results`;
light enough for the fast path (``os``-free, no ``typing`` at run time).
"""

from __future__ import annotations

# typing is not imported at run time: imexctl.hooks.entry's fast tier imports this module (docs/performance.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    #: one log line: its event and its fields, in order
    Line = tuple[str, dict[str, object]]

__all__ = ["epilog_fields", "prolog_fields", "skipped_lines"]


def prolog_fields(
    duration_s: float, *, skipped: str = "", told_user: bool = False, **summary: object
) -> dict[str, object]:
    """The fields of ``prolog.done``, in their order: ``ok``, the summary, ``duration_s``, then ``skipped``."""
    out: dict[str, object] = {"ok": True, **({"told_user": True} if told_user else {}), **summary}
    out["duration_s"] = duration_s
    if skipped:
        out["skipped"] = skipped
    return out


def skipped_lines(reason: str, told: bool, duration_s: float) -> list[Line]:
    """The lines of a prolog that skips its job: ``imex.skipped``, then ``prolog.done``."""
    return [
        ("imex.skipped", {"reason": reason}),
        ("prolog.done", prolog_fields(duration_s, skipped=reason, told_user=told)),
    ]


def epilog_fields(
    actions: Sequence[str], duration_s: float, lost: Sequence[str] = (), busy: Sequence[str] = ()
) -> dict[str, object]:
    """The fields of ``epilog.done``: ``ok``, ``actions``, ``duration_s``, then ``lost_daemon`` and ``busy_stop``.

    ``lost_daemon`` when a daemon was lost, ``busy_stop`` when one was stopped while the job's processes still
    held the NVIDIA driver.
    """
    out: dict[str, object] = {"ok": True, "actions": list(actions), "duration_s": duration_s}
    if lost:
        out["lost_daemon"] = list(lost)
    if busy:
        out["busy_stop"] = list(busy)
    return out
