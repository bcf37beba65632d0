"""Host names folded back into one Slurm hostlist expression, like ``scontrol show hostlist``.

The other half of :mod:`imexctl.slurm.nodelist` (whose ``fold`` loads this
module on first use): every prolog reads its job's node list, and only one
that sets up a domain, or an admin's command, writes one, so the prolog that
policy skips does not load this.  Same grammar, same bounds (Slurm's
``src/common/hostlist.c``; design.md source slurm-hostlist), and the same rule:
what Slurm would print but could not read back is split or kept plain instead.
"""

from __future__ import annotations

from imexctl.slurm.nodelist import MAX_RANGE, ULONG_MAX, digits_value

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Final

    from imexctl.platform.errors import NodeListError

__all__ = ["fold"]

#: most items in one bracket group that fold writes (expand reads 256 Ki, Slurm's MAX_RANGES)
_FOLD_MAX_ITEMS: Final = 64 * 1024
_DIGITS: Final = "0123456789"
#: what a host name may not hold: separators, brackets, a hostlist function's brace
_NAME_FORBIDDEN: Final = ",[]{ \t\n"


def fold(names: Iterable[str]) -> str:
    """Fold host names into one hostlist expression, like ``scontrol show hostlist``.

    Input order is kept.  A name ending in digits joins the previous range
    when it has the same prefix, is the next number and its zero padding is
    compatible (Slurm's ``_width_equiv``: ``node9,node10`` gives
    ``node[9-10]``, ``node09,node10`` gives ``node[09-10]``, ``node08,node9``
    stays ``node[08,9]``).  Adjacent ranges with one prefix share one bracket
    group; names without a numeric tail (``node1-ib``) stay single.
    Duplicates are kept (``n1,n1,n2`` gives ``n[1,1-2]``), so
    ``expand(fold(names)) == names`` holds for every valid list.

    Unlike Slurm, which would print expressions it cannot read back, a range
    is split after :data:`MAX_RANGE` hosts, a bracket group after 65,536
    items, and a numeric tail above 2**64-1 is kept as a plain name.

    Args:
        names: Host names; none may be empty or contain a separator, ``[``,
            ``]``, ``{`` or a non-printing character.

    Returns:
        The expression; ``""`` for no names.

    Raises:
        NodeListError: A name is invalid; ``part`` is that name.
    """
    names = list(names)
    _check_names(names)
    return _render(_collect(names))


def _check_names(names: list[str]) -> None:
    blob = "".join(names)
    if blob.isprintable() and not any(c in blob for c in _NAME_FORBIDDEN) and all(names):
        return
    nodelist = ",".join(names)
    for name in names:
        if not name:
            raise _error(nodelist, name, "empty host name")
        bad = [c for c in name if c in _NAME_FORBIDDEN or not c.isprintable()]
        if bad:
            raise _error(nodelist, name, f"character {bad[0]!r} in a host name")


def _collect(names: list[str]) -> list[tuple[str, int, int, int]]:
    """Group names into ``(prefix, lo, hi, width)`` runs; width -1 is a plain name.

    Mirrors Slurm's ``hostlist_push_range``: only the last run can grow, and
    only by the next number with a compatible width; unlike Slurm, a run stops
    at :data:`MAX_RANGE` hosts so that the result can be read back.
    """
    runs = []
    prefix_, lo_, hi_, width_ = "", 0, -2, -1
    for name in names:
        prefix = name.rstrip(_DIGITS)
        digits = name[len(prefix) :]
        number = digits_value(digits) if digits else ULONG_MAX + 1
        width = len(digits)
        if number == hi_ + 1 and prefix == prefix_ and width_ >= 0 and number - lo_ < MAX_RANGE and number <= ULONG_MAX:
            joined = width if width == width_ else _width_equiv(lo_, width_, number, width)
            if joined >= 0:
                hi_, width_ = number, joined
                continue
        runs.append((prefix_, lo_, hi_, width_))
        if number > ULONG_MAX:
            prefix_, lo_, hi_, width_ = name, 0, -2, -1
        else:
            prefix_, lo_, hi_, width_ = prefix, number, number, width
    runs.append((prefix_, lo_, hi_, width_))
    return runs[1:]


def _zero_pad(number: int, width: int) -> int:
    return max(width - len(str(number)), 0)


def _width_equiv(lo: int, lo_width: int, number: int, width: int) -> int:
    """Return the width under which *lo* and *number* keep their padding, or -1.

    Slurm's ``_width_equiv``: ``9`` (width 1) and ``10`` (width 2) share
    width 1; ``08`` and ``9`` share none.
    """
    lo_changes = _zero_pad(lo, lo_width) != _zero_pad(lo, width)
    number_changes = _zero_pad(number, width) != _zero_pad(number, lo_width)
    if lo_changes and number_changes:
        return -1
    return lo_width if lo_changes else width


def _render(runs: list[tuple[str, int, int, int]]) -> str:
    out: list[str] = []
    start = 0
    while start < len(runs):
        prefix, _, _, width = runs[start]
        end = start + 1
        if width >= 0:
            limit = min(len(runs), start + _FOLD_MAX_ITEMS)
            while end < limit and runs[end][3] >= 0 and runs[end][0] == prefix:
                end += 1
        out.append(_render_group(runs[start:end]))
        start = end
    return ",".join(out)


def _render_group(group: list[tuple[str, int, int, int]]) -> str:
    prefix, lo, hi, width = group[0]
    if width < 0:
        return prefix
    if len(group) == 1 and lo == hi:
        return f"{prefix}{lo:0{width}d}"
    items = ",".join(f"{lo:0{w}d}" if lo == hi else f"{lo:0{w}d}-{hi:0{w}d}" for _, lo, hi, w in group)
    return f"{prefix}[{items}]"


def _error(nodelist: str, part: str, reason: str) -> NodeListError:
    """Build the error to raise; imports :mod:`imexctl.platform.errors` on first use."""
    from imexctl.platform.errors import NodeListError

    return NodeListError(nodelist, part, reason)
