"""Corpus family 1: node lists (``SLURM_JOB_NODELIST``), one case per id.

``VECTORS`` are the reference expansions of Slurm master's ``hostlist.c``
(design.md source slurm-hostlist; the case numbers in the ids are those of
``tests/slurm/test_nodelist.py``).  ``MALFORMED`` must fail with ``nodelist_invalid`` (65)
naming the faulty ``part``; ``WRONG`` parse but cannot be a job's list
(``job_env_invalid``, 65); ``ACCEPTED`` are odd but valid lists the prolog
takes; ``HUGE`` are megabytes long or expand to millions of names and must
fail (or pass) in bounded time.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


def _names(fmt: str, first: int, last: int) -> list[str]:
    return [fmt.format(i) for i in range(first, last + 1)]


@dataclasses.dataclass(frozen=True)
class Vector:
    """A reference vector: Slurm master expands ``text`` to ``names``."""

    id: str
    text: str
    names: tuple[str, ...]


VECTORS = [
    Vector("v01-range", "node[1-3]", ("node1", "node2", "node3")),
    Vector("v02-padded", "node[01-03]", ("node01", "node02", "node03")),
    Vector("v03-unpadded-grows", "node[8-11]", ("node8", "node9", "node10", "node11")),
    Vector("v05-width-3", "node[098-101]", ("node098", "node099", "node100", "node101")),
    Vector("v08-width-per-item", "node[9,010]", ("node9", "node010")),
    Vector("v09-range-list", "node[1-3,5,7-8]", ("node1", "node2", "node3", "node5", "node7", "node8")),
    Vector("v10-order-kept", "n[3,1,2]", ("n3", "n1", "n2")),
    Vector("v11-duplicates-kept", "n[1-3],n2", ("n1", "n2", "n3", "n2")),
    Vector("v13-space-separator", "n[1-2] m[3-4]", ("n1", "n2", "m3", "m4")),
    Vector("v15-newline-separator", "n[1-2]\nn5", ("n1", "n2", "n5")),
    Vector("v16-empty-token", "n[1-2],,n3", ("n1", "n2", "n3")),
    Vector("v16-leading-trailing-comma", ",n1,", ("n1",)),
    Vector("v18-outer-group-slowest", "rack[1-2]-node[01-02]",
           ("rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02")),
    Vector("v21-suffix", "node[1-2]-ib", ("node1-ib", "node2-ib")),
    Vector("v23-last-bracket-is-range", "node[1-2]-ib[1-2]", ("node1-ib1", "node1-ib2", "node2-ib1", "node2-ib2")),
    Vector("v25-two-ranges", "node[1-2],node[3-4]", ("node1", "node2", "node3", "node4")),
    Vector("v27-prefix-ends-in-digit", "node1[1-2]", ("node11", "node12")),
    Vector("v28-empty-prefix", "[1-3]", ("1", "2", "3")),
    Vector("v39-limit-inclusive", "node[1-65536]", tuple(_names("node{}", 1, 65536))),
    Vector("v39-limit-from-zero", "node[0-65535]", tuple(_names("node{}", 0, 65535))),
    Vector("v41-limit-per-range", "gpu[00001-50000],gpu[50001-100000]", tuple(_names("gpu{:05d}", 1, 100000))),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Malformed:
    """An expression that is not a Slurm host list; ``part`` is the faulty piece the error must name."""

    id: str
    text: str
    part: str


MALFORMED = [
    # the reference error vectors
    Malformed("v32-open-bracket", "node[1-2", "node[1-2"),
    Malformed("v34-empty-brackets", "node[]", "[]"),
    Malformed("v34-letters", "node[a-c]", "a-c"),
    Malformed("v34-reversed", "node[3-1]", "3-1"),
    Malformed("v34-double-dash", "node[1--3]", "1--3"),
    Malformed("v34-negative", "node[-1]", "-1"),
    Malformed("v34-box", "node[1x2]", "1x2"),
    Malformed("v40-too-many-hosts", "node[1-70000]", "1-70000"),
    Malformed("v40-padded-too-many", "gpu[00001-100000]", "00001-100000"),
    # unbalanced brackets
    Malformed("unbalanced-open-at-end", "gb[01-02],gb[03", "gb[03"),
    Malformed("unbalanced-open-mid", "gb[01,gb02", "gb[01"),
    Malformed("unbalanced-close-only", "gb01]", "gb01]"),
    Malformed("unbalanced-close-after-group", "gb[01-02]]", "gb[01-02]]"),
    Malformed("unbalanced-close-before-open", "gb]01[", "gb]01["),
    Malformed("unbalanced-lone-open", "[", "["),
    Malformed("unbalanced-lone-close", "]", "]"),
    Malformed("unbalanced-close-in-second-token", "gb01,gb02]", "gb02]"),
    Malformed("unbalanced-suffix-close", "gb[01-02]x]", "gb[01-02]x]"),
    # nested brackets
    Malformed("nested-inner-group", "gb[0[1-2]]", "gb[0"),
    Malformed("nested-range-of-group", "gb[01-[02]]", "gb[01-"),
    Malformed("nested-double-open", "gb[[01-02]]", "gb["),
    Malformed("nested-prefix-open", "a[b[1-2]", "a[b"),
    # reversed, empty and odd ranges
    Malformed("reversed-padded", "gb[02-01]", "02-01"),
    Malformed("reversed-wide", "gb[18-1]", "18-1"),
    Malformed("reversed-second-item", "gb[01-02,09-03]", "09-03"),
    Malformed("empty-item-middle", "gb[01,,02]", "[01,,02]"),
    Malformed("empty-item-last", "gb[01,]", "[01,]"),
    Malformed("dash-only", "gb[-]", "-"),
    Malformed("missing-hi", "gb[01-]", "01-"),
    Malformed("step-slash", "gb[01-18/2]", "01-18/2"),
    Malformed("step-colon", "gb[01-18:2]", "01-18:2"),
    Malformed("plus-sign", "gb[+1-2]", "+1-2"),
    Malformed("blank-inside", "gb[ 01-02]", " 01-02"),
    # huge ranges
    Malformed("huge-one-over-limit", "gb[0-65536]", "0-65536"),
    Malformed("huge-ulong-max-plus-one", "gb[18446744073709551616]", "18446744073709551616"),
    Malformed("huge-hundred-digit-hi", "gb[1-" + "9" * 100 + "]", "1-" + "9" * 100),
    Malformed("huge-prefix-combinations", "a[1-300]b[1-300]c[1]", "a[1-300]b[1-300]c[1]"),
    # hostlist functions need slurmctld
    Malformed("function-blockwith", "blockwith{gb01}", "blockwith{gb01}"),
    Malformed("function-among-names", "gb01,block{b1}", "block{b1}"),
    # separators and characters that are not names
    Malformed("carriage-return", "gb01\r\ngb02", "gb01\r"),
    Malformed("vertical-tab", "gb01\vgb02", "gb01\vgb02"),
    Malformed("form-feed", "gb01\fgb02", "gb01\fgb02"),
    Malformed("nul-byte", "gb01,gb\x0002", "gb\x0002"),
    Malformed("escape-sequence", "gb01,\x1b[2Jgb02", "\x1b[2Jgb02"),
    Malformed("bell", "gb01,gb02\x07", "gb02\x07"),
    # non-ASCII
    Malformed("non-ascii-fullwidth-digits", "gb[\uff10\uff11-\uff10\uff12]", "\uff10\uff11-\uff10\uff12"),
    Malformed("non-ascii-arabic-indic", "gb[\u0660\u0661]", "\u0660\u0661"),
    Malformed("non-ascii-superscript", "gb[0\u00b9]", "0\u00b9"),
    Malformed("non-ascii-no-break-space", "gb01,\u00a0gb02", "\u00a0gb02"),
    Malformed("non-ascii-zero-width-space", "gb01,gb\u200b02", "gb\u200b02"),
    Malformed("non-ascii-rtl-override", "gb01,\u202egb02", "\u202egb02"),
    Malformed("non-ascii-line-separator", "gb01\u2028gb02", "gb01\u2028gb02"),
    Malformed("non-ascii-bom", "\ufeffgb[01-02]", "\ufeffgb[01-02]"),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Wrong:
    """A parseable list that cannot be this job's list (``job_env_invalid``, 65): the error names ``names``."""

    id: str
    nodelist: str | None
    node: str
    names: tuple[str, ...]
    legacy: str | None = None  # SLURM_NODELIST (22.05); None leaves it out


WRONG = [
    Wrong("missing-both-variables", None, "gb01", ("SLURM_JOB_NODELIST", "SLURM_NODELIST")),
    Wrong("empty-both-variables", "", "gb01", ("SLURM_JOB_NODELIST", "SLURM_NODELIST"), legacy=""),
    Wrong("blank", "   ", "gb01", ("SLURM_JOB_NODELIST", "SLURM_NODELIST")),
    Wrong("separators-only", ", ,\t,", "gb01", ("names no node",)),
    Wrong("node-not-in-list", "gb[02-03]", "gb01", ("'gb01'", "SLURMD_NODENAME")),
    Wrong("node-differs-in-padding", "gb[1-2]", "gb01", ("'gb01'", "is not in")),
    Wrong("node-differs-in-case", "GB[01-02]", "gb01", ("'gb01'", "is not in")),
    Wrong("node-fqdn", "gb01.rack1.example,gb02.rack1.example", "gb01", ("'gb01'", "is not in")),
    Wrong("semicolon-is-not-a-separator", "gb01;gb02", "gb01", ("'gb01'", "is not in")),
    Wrong("pipe-is-not-a-separator", "gb01|gb02", "gb01", ("'gb01'", "is not in")),
    Wrong("colon-is-not-a-separator", "gb01:gb02", "gb01", ("'gb01'", "is not in")),
    Wrong("duplicate-plain", "gb01,gb02,gb01", "gb01", ("gb01", "more than once")),
    Wrong("duplicate-vector-11", "gb[01-03],gb02", "gb01", ("gb02", "more than once")),
    Wrong("duplicate-overlapping-ranges", "gb[01-10],gb[05-12]", "gb01", ("gb05", "more than once")),
    Wrong("legacy-variable-only-bad", None, "gb01", ("'gb01'", "SLURM_NODELIST"), legacy="gb[02-03]"),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Accepted:
    """An odd but valid list: the prolog succeeds and the nodes file holds ``trays`` in this order."""

    id: str
    nodelist: str
    trays: tuple[str, ...]


ACCEPTED = [
    Accepted("separator-tab", "gb01\tgb02", ("gb01", "gb02")),
    Accepted("separator-newline", "gb01\ngb02\n", ("gb01", "gb02")),
    Accepted("separator-space-runs", "  gb01   gb02  ", ("gb01", "gb02")),
    Accepted("separator-mixed-runs", ",\t gb01 ,\n, gb02,,", ("gb01", "gb02")),
    Accepted("order-is-kept", "gb[03,01,02]", ("gb03", "gb01", "gb02")),
    Accepted("two-groups-one-rack", "gb[01-02],gb[17-18]", ("gb01", "gb02", "gb17", "gb18")),
    Accepted("whole-rack", "gb[01-18]", tuple(f"gb{i:02d}" for i in range(1, 19))),
    Accepted("single-tray", "gb01", ("gb01",)),
    Accepted("padded-hi-shorter", "gb[01-2]", ("gb01", "gb02")),
    Accepted("two-megabytes-of-separators", "gb[01-02]" + "," * 2_000_000, ("gb01", "gb02")),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Huge:
    """A list megabytes long or naming millions of hosts: bounded time, ``code`` (65) naming ``names``."""

    id: str
    make: Callable[[], str]
    code: str
    names: tuple[str, ...]
    exit_code: int = 65


def _plain(count: int, start: int = 100) -> str:
    return ",".join(f"x{i}" for i in range(start, start + count))


HUGE = [
    Huge("huge-16-million-names", lambda: "a[1-256]b[0-65535]", "nodelist_invalid", ("more than", "hosts")),
    Huge("huge-4-billion-names", lambda: "a[1-65536]b[0-65535]", "nodelist_invalid", ("more than", "hosts")),
    Huge("huge-many-groups", lambda: ",".join(f"g{i}[0-65535]" for i in range(40)), "nodelist_invalid",
         ("more than", "hosts")),
    Huge("huge-3mb-plain-names-without-this-node", lambda: _plain(300_000), "job_env_invalid",
         ("'gb01'", "is not in", "chars")),
    Huge("huge-100k-names-one-duplicate", lambda: "gb01," + _plain(100_000) + ",x100", "job_env_invalid",
         ("x100", "more than once")),
    Huge("huge-100k-duplicates", lambda: "gb01," + _plain(100_000) + "," + _plain(100_000), "job_env_invalid",
         ("more than once", "more")),
    Huge("huge-1mb-open-brackets", lambda: "gb01," + "[" * 1_000_000, "nodelist_invalid", ("not closed",)),
    Huge("huge-1mb-close-brackets", lambda: "gb01," + "]" * 1_000_000, "nodelist_invalid", ("outside a bracket",)),
    Huge("huge-1mb-token-bad-tail", lambda: "gb01," + "x" * 1_000_000 + "\x00", "nodelist_invalid",
         ("non-printing", "chars")),
    Huge("huge-200k-unresolvable-names", lambda: "gb01,n[" + ",".join(map(str, range(200_000))) + "]",
         "resolve_failed", ("n0: cannot resolve", "others"), exit_code=69),
    Huge("huge-300k-items-one-group", lambda: "gb01,n[" + ",".join(["1"] * 300_000) + "]", "nodelist_invalid",
         ("items in one bracket group",)),
    Huge("huge-1mb-digits-in-range", lambda: "gb01,n[1-" + "9" * 1_000_000 + "]", "nodelist_invalid",
         ("2**64-1",)),
]  # fmt: skip
