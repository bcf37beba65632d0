"""Corpus family 1: node lists, through ``nodelist.expand/fold`` and through the prolog (tests/corpus/nodelists.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imexctl.platform.errors import NodeListError
from imexctl.slurm.job import JobContext
from imexctl.slurm.nodefold import fold
from imexctl.slurm.nodelist import expand
from tests.corpus import nodelists
from tests.corpus._fakes import job_env
from tests.corpus._tray import Tray, ids


@pytest.fixture
def tray(root: Path) -> Tray:
    """A tray under the test's root (tests/conftest.py plants ``proc/devices``)."""
    return Tray(root)


# A huge case takes about a second on this 2-core machine (1.2 s at most, with the labs beside it), several with
# two CPU burners added; a quadratic or unbounded expansion takes minutes or exhausts memory.
HUGE_LIMIT_S = 30.0


def shown(part: str) -> str:
    """How an error message quotes ``part``: its repr, cut after 200 characters."""
    return repr(part) if len(part) <= 200 else repr(part[:200])


def env_for(nodelist: str, node: str = "gb01") -> dict[str, str]:
    return job_env(nodelist=nodelist, node=node)


def nodes_file(t: Tray) -> list[str]:
    return (t.root / "run/imexctl/jobs/42/nodes_config.cfg").read_text().splitlines()


class TestReferenceVectors:
    @pytest.mark.parametrize("case", nodelists.VECTORS, ids=ids(nodelists.VECTORS))
    def test_expand_agrees_with_slurm(self, case: nodelists.Vector) -> None:
        """expand() gives Slurm master's expansion of the reference vector, and fold() reads back."""
        assert list(case.names) == expand(case.text)
        assert list(case.names) == expand(fold(case.names))

    @pytest.mark.parametrize("case", [v for v in nodelists.VECTORS if len(v.names) <= 18],
                             ids=ids([v for v in nodelists.VECTORS if len(v.names) <= 18]))  # fmt: skip
    def test_prolog_writes_the_vector_in_order(self, case: nodelists.Vector, tray: Tray) -> None:
        """The prolog's nodes file lists the vector's trays in Slurm's order; a duplicate is refused."""
        addresses = {name: f"10.1.0.{i}" for i, name in enumerate(dict.fromkeys(case.names), 1)}
        tray.host.addresses = {name: [addr] for name, addr in addresses.items()}
        out = tray.prolog(env_for(case.text, node=case.names[0]))
        if len(set(case.names)) != len(case.names):
            out.assert_failed("job_env_invalid", 65, "more than once")
        else:
            out.assert_ok()
            assert [addresses[n] for n in case.names] == nodes_file(tray)
            tray.epilog(env_for(case.text, node=case.names[0])).assert_ok()
        tray.assert_clean()


class TestMalformed:
    @pytest.mark.parametrize("case", nodelists.MALFORMED, ids=ids(nodelists.MALFORMED))
    def test_expand_names_the_part(self, case: nodelists.Malformed) -> None:
        """expand() raises NodeListError whose part is the faulty piece."""
        with pytest.raises(NodeListError) as info:
            expand(case.text)
        assert (info.value.part, info.value.nodelist) == (case.part, case.text)

    @pytest.mark.parametrize("case", nodelists.MALFORMED, ids=ids(nodelists.MALFORMED))
    def test_prolog_exits_65_naming_the_part_and_leaves_nothing(self, case: nodelists.Malformed, tray: Tray) -> None:
        """The prolog exits 65 (nodelist_invalid) quoting the faulty part; the tray stays clean; the epilog is fine."""
        tray.prolog(env_for(case.text)).assert_failed("nodelist_invalid", 65, shown(case.part))
        tray.assert_clean()
        tray.epilog(env_for(case.text)).assert_ok()
        tray.assert_clean()


class TestWrongLists:
    @pytest.mark.parametrize("case", nodelists.WRONG, ids=ids(nodelists.WRONG))
    def test_prolog_exits_65_and_names_why(self, case: nodelists.Wrong, tray: Tray) -> None:
        """A list that parses but cannot be this job's list exits 65 (job_env_invalid) and says why."""
        env = job_env(node=case.node)
        for var, value in (("SLURM_JOB_NODELIST", case.nodelist), ("SLURM_NODELIST", case.legacy)):
            if value is None:
                env.pop(var)
            else:
                env[var] = value
        tray.prolog(env).assert_failed("job_env_invalid", 65, *case.names)
        tray.assert_clean()


class TestAccepted:
    @pytest.mark.parametrize("case", nodelists.ACCEPTED, ids=ids(nodelists.ACCEPTED))
    def test_prolog_takes_the_list_in_order(self, case: nodelists.Accepted, tray: Tray) -> None:
        """An odd but valid list is taken as Slurm reads it; the epilog then leaves the tray clean."""
        tray.prolog(env_for(case.nodelist)).assert_ok()
        assert [tray.host.addresses[n][0] for n in case.trays] == nodes_file(tray)
        tray.epilog(env_for(case.nodelist)).assert_ok()
        tray.assert_clean()


class TestHuge:
    @pytest.mark.parametrize("case", nodelists.HUGE, ids=ids(nodelists.HUGE))
    def test_bounded_time_and_a_short_clear_error(self, case: nodelists.Huge, tray: Tray) -> None:
        """A list megabytes long or naming millions of hosts fails fast, with a short message naming why."""
        text = case.make()
        start = time.monotonic()
        out = tray.prolog(env_for(text))
        assert time.monotonic() - start < HUGE_LIMIT_S
        out.assert_failed(case.code, case.exit_code, *case.names)
        tray.assert_clean()


# ---------------------------------------------------------------- properties

_NAME = st.text(alphabet="abgx-._1", min_size=1, max_size=4).map(lambda p: p.rstrip("0123456789") or "n")
_NAMES = st.lists(st.tuples(_NAME, st.integers(0, 300), st.integers(0, 4)), max_size=30).map(
    lambda items: [f"{p}{n:0{w}d}" for p, n, w in items]
)


class TestProperties:
    @given(_NAMES)
    def test_fold_then_expand_gives_the_list_back(self, names: list[str]) -> None:
        """expand(fold(names)) == names for any valid names, duplicates and order included."""
        assert names == expand(fold(names))

    @given(_NAMES.map(lambda ns: list(dict.fromkeys(["gb01", *ns]))))
    def test_a_folded_list_is_the_jobs_list(self, names: list[str]) -> None:
        """A job whose SLURM_JOB_NODELIST is the fold of its distinct trays reads back exactly those trays."""
        ctx = JobContext.from_env(env_for(fold(names)), need_nodes=True)
        assert tuple(names) == ctx.nodes

    @given(st.lists(st.sampled_from([v for v in nodelists.VECTORS if len(v.names) < 100]), min_size=1, max_size=4),
           st.sampled_from([",", " ", "\t", "\n", ",\n", " , "]))  # fmt: skip
    def test_expand_agrees_with_the_vectors_joined(self, vectors: list[nodelists.Vector], sep: str) -> None:
        """Reference vectors joined by any separator expand to their expansions, concatenated."""
        assert [n for v in vectors for n in v.names] == expand(sep.join(v.text for v in vectors))

    @given(st.text(max_size=40))
    def test_any_text_expands_or_names_a_part_of_it(self, text: str) -> None:
        """Any string either expands to names or raises NodeListError whose part is a piece of it."""
        try:
            names = expand(text)
        except NodeListError as exc:
            assert exc.part in text and exc.nodelist == text
        else:
            assert all(n and n.isprintable() for n in names)

    @given(st.lists(st.text(max_size=8), max_size=6))
    def test_any_names_fold_or_name_the_bad_one(self, names: list[str]) -> None:
        """fold() either gives an expression that reads back, or raises naming one of the names."""
        try:
            folded = fold(names)
        except NodeListError as exc:
            assert exc.part in names
        else:
            assert names == expand(folded)
