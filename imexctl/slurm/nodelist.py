"""Slurm hostlist expressions: expand them to host names (and fold names back, :mod:`imexctl.slurm.nodefold`).

This is an in-process copy of the grammar of Slurm's ``src/common/hostlist.c``
(master, one dimension; design.md source slurm-hostlist), so that the prolog
never starts ``scontrol`` (design.md source slurm-no-commands).  Importing it loads only the
``imexctl`` package: it uses plain ``str`` methods instead of ``re``, and
imports ``typing`` and
:mod:`imexctl.platform.errors` (which imports ``typing``, which imports ``re``) only for
type checkers and on the failure path, because the prolog delays every job
start.  Where Slurm silently accepts something odd we fail loudly instead,
because a wrong peer list is worse than a failed prolog; each such choice is
listed in :func:`expand` and :func:`fold`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

    from imexctl.platform.errors import NodeListError

__all__ = [
    "MAX_HOSTS",
    "MAX_PREFIX_COMBINATIONS",
    "MAX_RANGE",
    "MAX_RANGE_ITEMS",
    "ULONG_MAX",
    "digits_value",
    "expand",
]

MAX_RANGE: Final = 64 * 1024
"""Most hosts in one ``LO-HI`` item (Slurm's ``MAX_RANGE``)."""

MAX_PREFIX_COMBINATIONS: Final = 64 * 1024
"""Most distinct prefixes produced by all bracket groups but the last."""

MAX_RANGE_ITEMS: Final = 256 * 1024
"""Most comma-separated items in one bracket group (Slurm's ``MAX_RANGES``)."""

MAX_HOSTS: Final = 1024 * 1024
"""Most names one expression expands to, all tokens together (Slurm has no such limit)."""

ULONG_MAX: Final = 2**64 - 1
"""The largest number in a host name that Slurm reads (its ``strtoul``); above it a name has no number."""
_DIGITS: Final = "0123456789"
_SEPARATORS: Final = ", \t\n"


def expand(text: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order.

    Follows Slurm master: comma, space, tab and newline separate tokens (a run
    of them counts as one); a token without ``[`` is one literal name; in a
    token with brackets every ``[items]`` group expands, the left-most group
    varying slowest, and text after the last group is a suffix.  An item is
    ``N`` or ``LO-HI``; every number is zero-padded to the length of the LO
    text.  Order and duplicates are kept, like ``scontrol show hostnames``.
    ``""`` and separator-only strings give ``[]``.

    Deliberately stricter than Slurm, which accepts these silently:

    * a blank or ``+`` before a number (``n[ 1-3]``, ``n[+1]``): Slurm's
      ``strtoul`` skips them and counts them in the width;
    * ``LO-`` with no HI (``n[1-]``): Slurm reads it as ``n[1]``;
    * numbers above 2**64-1: Slurm's ``strtoul`` saturates;
    * a ``]`` outside a group, nested brackets, or a ``[`` in the prefix
      without ``]`` (``a]b``, ``n[1-2]]x``, ``a[b[1-2]``): Slurm copies
      such text into the names;
    * ``{`` anywhere: hostlist functions such as ``blockwith{node1}`` need
      slurmctld; ``scontrol`` would fall back to a literal name;
    * non-printing characters other than the tab and newline separators
      (CR, NUL, no-break space), which Slurm keeps inside names;
    * more than :data:`MAX_PREFIX_COMBINATIONS` prefixes counted over *all*
      leading groups together (Slurm counts per group);
    * more than :data:`MAX_RANGE_ITEMS` items in one group (Slurm: ``fatal()``);
    * more than :data:`MAX_HOSTS` names in all (``a[1-65536]b[0-65535]`` would
      be 4 billion): counted before anything is expanded, so a hostile
      expression fails in bounded time and memory.

    Like Slurm: more than :data:`MAX_RANGE` hosts in one item is an error,
    newline is a separator (Slurm >= 23.02) and suffixes work (>= 23.11).

    Args:
        text: The expression, e.g. ``SLURM_JOB_NODELIST``.

    Returns:
        The host names in Slurm's order, duplicates included.

    Raises:
        NodeListError: The expression is invalid; ``part`` is the faulty
            token, bracket group or item.
    """
    if not text.isprintable() and not text.replace("\t", " ").replace("\n", " ").isprintable():
        _check_printable(text)
    if "{" in text:
        raise _error(
            text,
            _token_around(text, text.index("{")),
            "hostlist functions need slurmctld and are not expanded in-process",
        )
    if "[" not in text and "]" not in text:
        names = [t for t in _split_separators(text) if t]
        if len(names) > MAX_HOSTS:
            raise _error(text, names[MAX_HOSTS], f"more than {MAX_HOSTS} hosts in the list")
        return names
    names = []
    for pieces in _tokens(text):
        names.extend(_expand_token(text, pieces, MAX_HOSTS - len(names)))
    return names


def _error(nodelist: str, part: str, reason: str) -> NodeListError:
    """Build the error to raise; imports :mod:`imexctl.platform.errors` on first use."""
    from imexctl.platform.errors import NodeListError

    return NodeListError(nodelist, part, reason)


def _split_separators(text: str) -> list[str]:
    return text.replace(" ", ",").replace("\t", ",").replace("\n", ",").split(",")


def _token_around(text: str, index: int) -> str:
    """Return the separator-delimited run of *text* that contains *index*."""
    start, end = index, index
    while start > 0 and text[start - 1] not in _SEPARATORS:
        start -= 1
    while end < len(text) and text[end] not in _SEPARATORS:
        end += 1
    return text[start:end]


def _check_printable(text: str) -> None:
    for index, char in enumerate(text):
        if char not in "\t\n" and not char.isprintable():
            raise _error(text, _token_around(text, index), f"non-printing character {char!r}")


def _tokens(text: str) -> list[list[str]]:
    """Split *text* into tokens of alternating text and bracket contents.

    A token ``a[1-2]b[3]c`` becomes ``["a", "1-2", "b", "3", "c"]``.  Like
    Slurm's ``_next_tok``, separators inside brackets do not split a token.
    """
    segments = text.split("[")
    tokens: list[list[str]] = []
    current = _push_outside(tokens, None, segments[0], more=len(segments) > 1)
    for number, segment in enumerate(segments[1:], start=2):
        assert current is not None
        close = segment.find("]")
        if close < 0:
            raw = _raw(current) + "[" + _split_separators(segment)[0]
            last = number == len(segments)
            reason = "'[' without ']'" if last else "'[' not closed before the next '['"
            raise _error(text, raw, reason)
        current.append(segment[:close])
        current = _push_outside(tokens, current, segment[close + 1 :], more=number < len(segments))
    return tokens


def _push_outside(tokens: list[list[str]], current: list[str] | None, outside: str, *, more: bool) -> list[str] | None:
    """Add the text between two groups; return the token still open, if any."""
    parts = _split_separators(outside)
    if current is not None:
        current.append(parts[0])
        if len(parts) == 1 and more:
            return current
        tokens.append(current)
        parts = parts[1:]
        if not parts:
            return None
    tokens.extend([p] for p in parts[:-1] if p)
    if more:
        return [parts[-1]]
    if parts[-1]:
        tokens.append([parts[-1]])
    return None


def _raw(pieces: list[str]) -> str:
    """Rebuild the token text from its pieces."""
    return "".join(p if i % 2 == 0 else f"[{p}]" for i, p in enumerate(pieces))


def _expand_token(text: str, pieces: list[str], budget: int) -> list[str]:
    """Expand one token into at most *budget* names (else the whole list has too many)."""
    texts, groups = pieces[0::2], pieces[1::2]
    if any("]" in t for t in texts):
        raise _error(text, _raw(pieces), "']' outside a bracket group")
    count = 1
    parsed = [_parse_group(text, g) for g in groups]
    for items in parsed[:-1]:
        count *= sum(hi - lo + 1 for lo, hi, _ in items)
    if count > MAX_PREFIX_COMBINATIONS:
        raise _error(text, _raw(pieces), f"more than {MAX_PREFIX_COMBINATIONS} prefix combinations")
    count *= sum(hi - lo + 1 for lo, hi, _ in parsed[-1]) if parsed else 1
    if count > budget:
        raise _error(text, _raw(pieces), f"more than {MAX_HOSTS} hosts in the list")
    if not groups:
        return pieces
    prefixes = [texts[0]]
    for items, after in zip(parsed[:-1], texts[1:-1]):
        values = [f"{j:0{w}d}" for lo, hi, w in items for j in range(lo, hi + 1)]
        prefixes = [p + v + after for p in prefixes for v in values]
    return _expand_last(prefixes, parsed[-1], texts[-1])


def _expand_last(prefixes: list[str], items: list[tuple[int, int, int]], suffix: str) -> list[str]:
    names: list[str] = []
    suffix = suffix.replace("%", "%%")
    widths = {width for _, _, width in items}
    for prefix in prefixes:
        stem = prefix.replace("%", "%%")
        formats = {width: f"{stem}%0{width}d{suffix}" for width in widths}
        if len(formats) == 1:
            (fmt,) = formats.values()
            names += [fmt % i for lo, hi, _ in items for i in range(lo, hi + 1)]
        else:
            names += [formats[w] % i for lo, hi, w in items for i in range(lo, hi + 1)]
    return names


def _parse_group(text: str, group: str) -> list[tuple[int, int, int]]:
    """Parse the inside of one bracket group into ``(lo, hi, width)`` items."""
    items = group.split(",")
    if len(items) > MAX_RANGE_ITEMS:
        raise _error(text, f"[{group}]", f"more than {MAX_RANGE_ITEMS} items in one bracket group")
    if not group.isascii():
        bad = next(item for item in items if not item.isascii())
        raise _error(text, bad, "not a number or LO-HI range")
    parsed = []
    for item in items:
        # ASCII only from here, so isdigit() means [0-9]+.
        lo_text, dash, hi_text = item.partition("-")
        if lo_text.isdigit() and (not dash or hi_text.isdigit()):
            lo = int(lo_text) if len(lo_text) <= 20 else digits_value(lo_text)
            hi = (int(hi_text) if len(hi_text) <= 20 else digits_value(hi_text)) if dash else lo
            if lo <= hi < lo + MAX_RANGE and hi <= ULONG_MAX:
                parsed.append((lo, hi, len(lo_text)))
                continue
        raise _error(text, item or f"[{group}]", _item_error(item))
    return parsed


def _item_error(item: str) -> str:
    """Explain why *item* is not ``N`` or ``LO-HI``."""
    lo_text, _, hi_text = item.partition("-")
    if not item:
        return "empty item in a bracket group"
    if "x" in item:
        return "box syntax 'AxB' exists only on multi-dimensional clusters"
    if ":" in item or "/" in item:
        return "step syntax is not supported"
    if item.startswith("-"):
        return "missing number before '-' (no negative numbers)"
    if item.count("-") > 1:
        return "more than one '-' in a range"
    if item[:1].isspace() or hi_text[:1].isspace() or "+" in item:
        return "blank or '+' before a number (Slurm's strtoul would skip it; we do not)"
    if item.endswith("-"):
        return "missing number after '-'"
    if not item.replace("-", "").isdigit():
        return "not a number or LO-HI range"
    lo, hi = digits_value(lo_text), digits_value(hi_text or lo_text)
    if hi > ULONG_MAX:
        return "number above 2**64-1"
    if lo > hi:
        return "range LO is greater than HI"
    return f"Too many hosts in range (more than {MAX_RANGE})"


def digits_value(digits: str) -> int:
    """Return the value of ASCII *digits*, or 2**64 for anything above 2**64-1."""
    if len(digits) > 20:
        digits = digits.lstrip("0") or "0"
        if len(digits) > 20:
            return ULONG_MAX + 1
    return int(digits)
