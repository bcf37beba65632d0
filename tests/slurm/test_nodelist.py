"""Tests for imexctl.slurm.nodelist: Slurm hostlist expansion and folding.

Case numbers in ids refer to the reference vectors of the Slurm vectors (design.md source slurm-hostlist).
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imexctl.platform.errors import NodeListError
from imexctl.slurm.nodefold import fold
from imexctl.slurm.nodelist import MAX_PREFIX_COMBINATIONS, MAX_RANGE, MAX_RANGE_ITEMS, expand
from tests.support.ci import unavailable


def _names(fmt: str, first: int, last: int) -> list[str]:
    return [fmt.format(i) for i in range(first, last + 1)]


# (input, expansion) of the Slurm vectors (design.md source slurm-hostlist); "22.05" marks vectors on which Slurm
# 22.05 agrees with master (22.05 lacks the newline separator and suffixes).
SLURM_VECTORS = [
    pytest.param("node[1-3]", ["node1", "node2", "node3"], "22.05", id="1-range"),
    pytest.param("node[01-03]", ["node01", "node02", "node03"], "22.05", id="2-padded"),
    pytest.param("node[8-11]", ["node8", "node9", "node10", "node11"], "22.05", id="3-unpadded"),
    pytest.param("node[098-101]", ["node098", "node099", "node100", "node101"], "22.05", id="5-width-3"),
    pytest.param("node[9,010]", ["node9", "node010"], "22.05", id="8-width-per-item"),
    pytest.param("node[1-3,5,7-8]", ["node1", "node2", "node3", "node5", "node7", "node8"], "22.05", id="9-range-list"),
    pytest.param("n[3,1,2]", ["n3", "n1", "n2"], "22.05", id="10-order-kept"),
    pytest.param("n[1-3],n2", ["n1", "n2", "n3", "n2"], "22.05", id="11-duplicates-kept"),
    pytest.param("n[1-2] m[3-4]", ["n1", "n2", "m3", "m4"], "22.05", id="13-space-separator"),
    pytest.param("n[1-2]\nn5", ["n1", "n2", "n5"], "master", id="15-newline-separator"),
    pytest.param("n[1-2],,n3", ["n1", "n2", "n3"], "22.05", id="16-empty-token"),
    pytest.param(",n1,", ["n1"], "22.05", id="16-leading-trailing-comma"),
    pytest.param(
        "rack[1-2]-node[01-02]",
        ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
        "22.05",
        id="18-outer-group-slowest",
    ),
    pytest.param("node[1-2]-ib", ["node1-ib", "node2-ib"], "master", id="21-suffix"),
    pytest.param(
        "node[1-2]-ib[1-2]",
        ["node1-ib1", "node1-ib2", "node2-ib1", "node2-ib2"],
        "22.05",
        id="23-last-bracket-is-range",
    ),
    pytest.param("node[1-2],node[3-4]", ["node1", "node2", "node3", "node4"], "22.05", id="25-two-ranges"),
    pytest.param("node1[1-2]", ["node11", "node12"], "22.05", id="27-prefix-ends-in-digit"),
    pytest.param("[1-3]", ["1", "2", "3"], "22.05", id="28-empty-prefix"),
    pytest.param("node[1-65536]", _names("node{}", 1, 65536), "22.05", id="39-limit-inclusive"),
    pytest.param("node[0-65535]", _names("node{}", 0, 65535), "22.05", id="39-limit-from-zero"),
    pytest.param(
        "gpu[00001-50000],gpu[50001-100000]", _names("gpu{:05d}", 1, 100000), "22.05", id="41-limit-per-range"
    ),
]

MORE_VECTORS = [
    pytest.param("", [], id="empty"),
    pytest.param(" \t\n,, ", [], id="separators-only"),
    pytest.param("a", ["a"], id="one-name"),
    pytest.param("a\tb\n\nc , d", ["a", "b", "c", "d"], id="mixed-separator-runs"),
    pytest.param("b,a,b", ["b", "a", "b"], id="plain-duplicates-kept"),
    pytest.param("node[1-03]", ["node1", "node2", "node3"], id="width-from-lo-only"),
    pytest.param("node[01-3]", ["node01", "node02", "node03"], id="hi-may-be-shorter"),
    pytest.param("n[5]", ["n5"], id="single-item"),
    pytest.param("a[1-2]b[3]c", ["a1b3c", "a2b3c"], id="two-groups-and-suffix"),
    pytest.param("[1-2]x", ["1x", "2x"], id="empty-prefix-with-suffix"),
    pytest.param(
        "a[1-2]b[3-4]c[5-6]",
        ["a1b3c5", "a1b3c6", "a1b4c5", "a1b4c6", "a2b3c5", "a2b3c6", "a2b4c5", "a2b4c6"],
        id="three-groups",
    ),
    pytest.param("r[1,3]-n[1-2]", ["r1-n1", "r1-n2", "r3-n1", "r3-n2"], id="list-in-prefix"),
    pytest.param("n[1-2] [3] x", ["n1", "n2", "3", "x"], id="bracket-only-token"),
    pytest.param("p%d[1-2]%s", ["p%d1%s", "p%d2%s"], id="percent-is-literal"),
    pytest.param(
        "n[000000000000000000000001-2]",
        ["n000000000000000000000001", "n000000000000000000000002"],
        id="longer-than-20-digits",
    ),
    pytest.param("n[18446744073709551615]", ["n18446744073709551615"], id="ulong-max"),
    pytest.param(
        "gpu[00001-00003]-ib,gpu9", ["gpu00001-ib", "gpu00002-ib", "gpu00003-ib", "gpu9"], id="suffix-then-plain"
    ),
    pytest.param("n}1,a.b-c_d", ["n}1", "a.b-c_d"], id="other-punctuation-literal"),
]


class TestExpand:
    @pytest.mark.parametrize(("text", "expected", "since"), SLURM_VECTORS)
    def test_slurm_vectors(self, text: str, expected: list[str], since: str) -> None:
        """Each Slurm vector expands exactly as Slurm master does."""
        assert expected == expand(text)

    @pytest.mark.parametrize(("text", "expected"), MORE_VECTORS)
    def test_more_vectors(self, text: str, expected: list[str]) -> None:
        """Separators, padding, several groups and literal characters follow Slurm."""
        assert expected == expand(text)


BAD_INPUTS = [
    pytest.param("node[1-2", "node[1-2", "without ']'", id="32-open-bracket"),
    pytest.param("node[]", "[]", "empty item", id="34-empty-brackets"),
    pytest.param("node[a-c]", "a-c", "not a number", id="34-letters"),
    pytest.param("node[3-1]", "3-1", "LO is greater than HI", id="34-descending"),
    pytest.param("node[1--3]", "1--3", "more than one '-'", id="34-double-dash"),
    pytest.param("node[-1]", "-1", "no negative", id="34-leading-dash"),
    pytest.param("node[1x2]", "1x2", "box syntax", id="34-box"),
    pytest.param("node[1-70000]", "1-70000", "Too many hosts in range", id="40-range-too-big"),
    pytest.param("gpu[00001-100000]", "00001-100000", "Too many hosts in range", id="40-padded-range-too-big"),
    pytest.param("node[1-65537]", "1-65537", "Too many hosts in range", id="40-one-over"),
    pytest.param("node[1-10:2]", "1-10:2", "step syntax", id="step-colon"),
    pytest.param("node[1-9/2]", "1-9/2", "step syntax", id="step-slash"),
    pytest.param("node[1,,3]", "[1,,3]", "empty item", id="empty-middle-item"),
    pytest.param("node[1,]", "[1,]", "empty item", id="empty-last-item"),
    pytest.param("node[,]", "[,]", "empty item", id="only-comma"),
    pytest.param("n[ 1-3]", " 1-3", "blank or '+'", id="strtoul-leading-blank"),
    pytest.param("n[1, 2]", " 2", "blank or '+'", id="strtoul-blank-after-comma"),
    pytest.param("n[1-\t3]", "1-\t3", "blank or '+'", id="strtoul-tab-before-hi"),
    pytest.param("n[+1-3]", "+1-3", "blank or '+'", id="strtoul-plus-lo"),
    pytest.param("n[1-+3]", "1-+3", "blank or '+'", id="strtoul-plus-hi"),
    pytest.param("n[1-]", "1-", "missing number after '-'", id="lo-dash-no-hi"),
    pytest.param("n[1 2]", "1 2", "not a number", id="blank-inside-item"),
    pytest.param("n[18446744073709551616]", "18446744073709551616", "2**64-1", id="strtoul-saturation"),
    pytest.param("n[\u0661]", "\u0661", "not a number", id="arabic-indic-digit"),
    pytest.param("n[\u00b2]", "\u00b2", "not a number", id="superscript-digit"),
    pytest.param("blockwith{node1}", "blockwith{node1}", "slurmctld", id="hostlist-function"),
    pytest.param("n1,block{b1},n2", "block{b1}", "slurmctld", id="function-among-names"),
    pytest.param("a]b", "a]b", "outside a bracket group", id="stray-close-bracket"),
    pytest.param("n[1-2]]x", "n[1-2]]x", "outside a bracket group", id="double-close-bracket"),
    pytest.param("]", "]", "outside a bracket group", id="only-close-bracket"),
    pytest.param("[", "[", "without ']'", id="only-open-bracket"),
    pytest.param("a[b[1-2]", "a[b", "not closed before the next '['", id="open-bracket-in-prefix"),
    pytest.param("a[1[2]]", "a[1", "not closed before the next '['", id="nested-brackets"),
    pytest.param("n[1,2", "n[1", "without ']'", id="open-bracket-ends-at-separator"),
    pytest.param("n1\r,n2", "n1\r", "non-printing", id="carriage-return"),
    pytest.param("n1,n\x002", "n\x002", "non-printing", id="nul"),
    pytest.param("n\u00a01", "n\u00a01", "non-printing", id="no-break-space"),
    pytest.param("a[1-300]b[1-300]c[1]", "a[1-300]b[1-300]c[1]", "prefix combinations", id="prefix-combinations"),
]


class TestExpandErrors:
    @pytest.mark.parametrize(("text", "part", "reason"), BAD_INPUTS)
    def test_bad_input_names_part(self, text: str, part: str, reason: str) -> None:
        """Each bad input raises NodeListError naming the faulty part and why."""
        with pytest.raises(NodeListError) as info:
            expand(text)

        assert (text, part) == (info.value.nodelist, info.value.part)
        assert reason in info.value.reason

    def test_message_quotes_part(self) -> None:
        """The message shows the faulty part, so the log line alone explains it."""
        with pytest.raises(NodeListError, match=r"'3-1' in 'gpu\[3-1\]'"):
            expand("gpu[3-1]")

    def test_prefix_combinations_limit_is_inclusive(self) -> None:
        """Exactly MAX_PREFIX_COMBINATIONS prefixes are still expanded."""
        assert len(expand("a[1-256]b[1-256]c[1]")) == MAX_PREFIX_COMBINATIONS

    def test_too_many_items_in_one_group(self) -> None:
        """More than MAX_RANGE_ITEMS items in one bracket group is an error, not a crash."""
        group = "[" + ",".join(["1"] * (MAX_RANGE_ITEMS + 1)) + "]"

        with pytest.raises(NodeListError, match="items in one bracket group") as info:
            expand("n" + group)

        assert group == info.value.part


class TestImport:
    def test_import_loads_no_heavy_module(self) -> None:
        """Importing the module loads neither re, typing nor imexctl.platform.errors (prolog start-up)."""
        code = "import sys, imexctl.slurm.nodelist; print(sorted({'re', 'typing', 'imexctl.platform.errors'} & set(sys.modules)))"
        proc = subprocess.run(
            [sys.executable, "-S", "-c", code],
            cwd=Path(__file__).parents[2],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

        assert proc.stdout.strip() == "[]"


FOLD_CASES = [
    pytest.param(["node9", "node10"], "node[9-10]", id="47-width-equiv-unpadded"),
    pytest.param(["node09", "node10"], "node[09-10]", id="47-width-equiv-padded"),
    pytest.param(["node1", "node2", "node3", "node4"], "node[1-4]", id="25-joined"),
    pytest.param(["node1-ib", "node2-ib"], "node1-ib,node2-ib", id="21-suffix-stays-plain"),
    pytest.param([], "", id="empty"),
    pytest.param(["node1"], "node1", id="single-no-brackets"),
    pytest.param(["n2", "n1", "n3"], "n[2,1,3]", id="order-kept"),
    pytest.param(["n1", "n1", "n2"], "n[1,1-2]", id="duplicates-kept"),
    pytest.param(["n1", "n01", "n001"], "n[1,01,001]", id="distinct-widths"),
    pytest.param(["n99", "n100", "n0101"], "n[99-100,0101]", id="widening-then-padded"),
    pytest.param(["n08", "n9", "n10"], "n[08,9-10]", id="incompatible-then-join"),
    pytest.param(["n9", "n10", "n010"], "n[9-10,010]", id="join-then-incompatible"),
    pytest.param(["n0", "n00", "n1"], "n[0,00,1]", id="zeros"),
    pytest.param(["n", "n1", "n2"], "n,n[1-2]", id="plain-name-not-in-group"),
    pytest.param(["x1", "y1", "x2"], "x1,y1,x2", id="prefix-runs-only-adjacent"),
    pytest.param(["a1", "a2", "b1", "b3", "a3"], "a[1-2],b[1,3],a3", id="several-prefixes"),
    pytest.param(["1", "2", "3"], "[1-3]", id="digits-only"),
    pytest.param(["007"], "007", id="digits-only-single"),
    pytest.param(["rack1-node01", "rack1-node02"], "rack1-node[01-02]", id="digit-in-prefix"),
    pytest.param(
        ["n18446744073709551615", "n18446744073709551616"],
        "n18446744073709551615,n18446744073709551616",
        id="tail-above-ulong-max-plain",
    ),
]


class TestFold:
    @pytest.mark.parametrize(("names", "expected"), FOLD_CASES)
    def test_fold(self, names: list[str], expected: str) -> None:
        """Names fold like `scontrol show hostlist` and expand back to themselves."""
        assert expected == fold(names)
        assert names == expand(fold(names))

    def test_accepts_any_iterable(self) -> None:
        """A generator is folded like the list it yields."""
        assert fold(f"gpu{i}" for i in range(1, 4)) == "gpu[1-3]"

    def test_case_25_recompresses(self) -> None:
        """Two adjacent ranges fold into one (Slurm vector case 25)."""
        assert fold(expand("node[1-2],node[3-4]")) == "node[1-4]"

    def test_splits_ranges_slurm_cannot_read(self) -> None:
        """A run longer than MAX_RANGE hosts is split, so Slurm and expand accept it."""
        names = _names("gpu{:06d}", 1, 100000)

        assert MAX_RANGE == 65536
        assert fold(names) == "gpu[000001-065536,065537-100000]"
        assert names == expand(fold(names))

    def test_splits_huge_bracket_groups(self) -> None:
        """More than 65,536 items with one prefix go into two bracket groups."""
        names = _names("n{}", 0, 2 * 65537)[::2]

        folded = fold(names)

        assert folded.count("[") == 2
        assert names == expand(folded)

    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param("", id="empty"),
            pytest.param("a,b", id="comma"),
            pytest.param("a b", id="space"),
            pytest.param("a\tb", id="tab"),
            pytest.param("a\nb", id="newline"),
            pytest.param("a[1]", id="open-bracket"),
            pytest.param("a]", id="close-bracket"),
            pytest.param("a{b}", id="brace"),
            pytest.param("a\rb", id="carriage-return"),
        ],
    )
    def test_invalid_name_is_the_part(self, bad: str) -> None:
        """A name that cannot appear in a hostlist is reported as the faulty part."""
        with pytest.raises(NodeListError) as info:
            fold(["ok1", bad, "ok2"])

        assert bad == info.value.part


# Host names: an optional prefix and an optional zero-padded number, often in
# consecutive runs so that folding has something to join.
_PREFIX = st.text(alphabet="ab-._}1", max_size=4) | st.sampled_from(["node", "gpu-", "x1"])
_NUMBER = st.integers(0, 120) | st.sampled_from([2**64 - 2, 2**64 - 1, 2**64, 10**25])


@st.composite
def _name_runs(draw: st.DrawFn) -> list[str]:
    prefix, start = draw(_PREFIX), draw(_NUMBER)
    width, length = draw(st.integers(0, 4)), draw(st.integers(1, 4))
    names = [f"{prefix}{i:0{width}d}" for i in range(start, start + length)]
    return names if draw(st.booleans()) else [n + draw(st.sampled_from(["", "-ib", "x"])) for n in names]


_NAME_LISTS = st.lists(_name_runs(), max_size=12).map(lambda runs: functools.reduce(operator.iadd, runs, []))


@st.composite
def _items(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One bracket item and the numbers it stands for."""
    lo, count, pad = draw(st.integers(0, 1200)), draw(st.integers(1, 3)), draw(st.integers(0, 2))
    lo_text = f"{lo:0{len(str(lo)) + pad}d}"
    numbers = [f"{i:0{len(lo_text)}d}" for i in range(lo, lo + count)]
    hi_text = str(lo + count - 1) if count > 1 or draw(st.booleans()) else ""
    return (f"{lo_text}-{hi_text}" if hi_text else lo_text), numbers


@st.composite
def _tokens(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One hostlist token and its expansion, built independently of expand()."""
    texts = draw(st.lists(st.text(alphabet="ab-.1", max_size=3), min_size=1, max_size=4))
    if len(texts) == 1:
        name = texts[0] or "n"
        return name, [name]
    groups = [draw(st.lists(_items(), min_size=1, max_size=3)) for _ in texts[1:]]
    text = texts[0] + "".join("[" + ",".join(item for item, _ in g) + "]" + t for g, t in zip(groups, texts[1:]))
    values = [[v for _, numbers in g for v in numbers] for g in groups]
    names = ["".join(itertools.chain.from_iterable(zip(texts, (*combo, "")))) for combo in itertools.product(*values)]
    return text, names


class TestProperties:
    @given(_NAME_LISTS)
    def test_round_trip(self, names: list[str]) -> None:
        """Expanding a fold gives back the names, in order, duplicates included."""
        assert names == expand(fold(names))

    @given(_NAME_LISTS)
    def test_fold_is_stable(self, names: list[str]) -> None:
        """Folding an expanded fold gives the same expression."""
        assert fold(names) == fold(expand(fold(names)))

    @given(st.lists(_tokens(), max_size=5), st.sampled_from([",", " ", "\t", "\n", ", ", ",,"]))
    def test_count_and_names_match_ranges(self, tokens: list[tuple[str, list[str]]], separator: str) -> None:
        """The expansion has as many names as the ranges imply, in product order."""
        text = separator.join(t for t, _ in tokens)
        implied = [name for _, names in tokens for name in names]

        result = expand(text)

        assert len(implied) == len(result)
        assert implied == result


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[str, str]]:
    """Run `scontrol show <what> <arg>` with a throw-away slurm.conf; skip if absent."""
    path = shutil.which("scontrol")
    if path is None:
        unavailable("scontrol is not installed (Debian's slurm-client; bash .ci/setup test installs it)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=imexctl-test\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def run(what: str, arg: str) -> tuple[str, str]:
        proc = subprocess.run(
            [path, "show", what, arg], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        return proc.stdout, proc.stderr

    return run


class TestAgainstScontrol:
    @pytest.mark.parametrize(("text", "expected", "since"), [p for p in SLURM_VECTORS if p.values[2] == "22.05"])
    def test_expansion_matches_scontrol(
        self,
        scontrol: Callable[[str, str], tuple[str, str]],
        text: str,
        expected: list[str],
        since: str,
    ) -> None:
        """The installed scontrol expands the vectors 22.05 shares with master as we do."""
        stdout, stderr = scontrol("hostnames", text)

        assert (expand(text), "") == (stdout.splitlines(), stderr)

    @pytest.mark.parametrize(
        ("text", "part", "reason"), [p for p in BAD_INPUTS if str(p.id).startswith(("34-", "40-"))]
    )
    def test_errors_match_scontrol(
        self,
        scontrol: Callable[[str, str], tuple[str, str]],
        text: str,
        part: str,
        reason: str,
    ) -> None:
        """The vectors that we reject are rejected by the installed scontrol too."""
        stdout, stderr = scontrol("hostnames", text)

        assert (stdout, "Invalid hostlist" in stderr) == ("", True)
        with pytest.raises(NodeListError):
            expand(text)

    @pytest.mark.parametrize(
        ("names", "expected"), [p for p in FOLD_CASES if p.id not in ("empty", "tail-above-ulong-max-plain")]
    )
    def test_fold_matches_scontrol(
        self,
        scontrol: Callable[[str, str], tuple[str, str]],
        names: list[str],
        expected: str,
    ) -> None:
        """The installed `scontrol show hostlist` folds these names as we do."""
        stdout, _ = scontrol("hostlist", ",".join(names))

        assert fold(names) == stdout.strip()
