"""Record: what typing.NamedTuple makes, made without its annotation checks."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, get_type_hints

import pytest

from imexctl.platform import Record


class Typed(NamedTuple):
    """A record as typing makes it."""

    job: int
    node: str = ""
    nodes: tuple[str, ...] = ()
    LIMIT = 3

    def first(self) -> str:
        return self.nodes[0] if self.nodes else self.node

    @property
    def big(self) -> bool:
        return self.job > self.LIMIT


class Ours(Record):
    """A record as typing makes it."""

    job: int
    node: str = ""
    nodes: tuple[str, ...] = ()
    LIMIT = 3

    def first(self) -> str:
        return self.nodes[0] if self.nodes else self.node

    @property
    def big(self) -> bool:
        return self.job > self.LIMIT


def test_the_class_is_the_one_typing_makes() -> None:
    """Fields, defaults, type hints, docstring, module, name, constants, methods and properties all agree."""
    for attr in ("_fields", "_field_defaults", "__doc__", "__module__", "LIMIT"):
        assert getattr(Ours, attr) == getattr(Typed, attr), attr
    # typing keeps each annotation as a ForwardRef, Record as its string: both resolve to the same types
    assert get_type_hints(Ours) == get_type_hints(Typed) == {"job": int, "node": str, "nodes": tuple[str, ...]}
    assert (Ours.__name__, Ours.__qualname__) == ("Ours", "Ours") and Ours.__mro__[1:] == (tuple, object)
    ours, typed = Ours(7, "gb01"), Typed(7, "gb01")
    assert tuple(ours) == tuple(typed) == (7, "gb01", ())
    assert repr(ours) == repr(typed).replace("Typed", "Ours")
    assert (ours.first(), ours.big, ours._asdict()) == (typed.first(), typed.big, typed._asdict())
    assert ours._replace(nodes=("gb02",)).first() == "gb02"


def test_a_record_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Ours(1).job = 2  # type: ignore[misc]


def test_a_field_without_a_default_after_one_with_is_refused() -> None:
    """collections.namedtuple would give the defaults to the wrong fields: refused as typing refuses it."""
    with pytest.raises(TypeError, match="field b without a default follows one with a default"):

        class Bad(Record):
            a: int = 0
            b: int


@pytest.mark.parametrize("name", ["__init__", "_replace", "_asdict", "__slots__"])
def test_what_namedtuple_owns_cannot_be_defined(name: str) -> None:
    (base,) = Record.__mro_entries__(())  # what a class statement does with Record among its bases
    with pytest.raises(AttributeError, match=f"cannot define {name}"):
        type(base)("Bad", (base,), {"__module__": __name__, "__annotations__": {"a": "int"}, name: None})


def test_a_record_derives_from_record_alone() -> None:
    with pytest.raises(TypeError, match="derives from Record alone"):

        class Mixed(Record, int):  # type: ignore[misc]
            a: int


def test_made_without_collections_as_namedtuple_makes_it() -> None:
    """Everything else namedtuple gives its classes, without importing collections (the fast tier's 2 ms)."""
    ours, typed = Ours(job=7, nodes=("a",)), Typed(job=7, nodes=("a",))
    assert ours == (7, "", ("a",)) and hash(ours) == hash(typed) and Ours.__match_args__ == Typed.__match_args__
    assert Ours._make([1, "n", ()]) == Typed._make([1, "n", ()]) and type(Ours._make((1, "", ()))) is Ours
    assert copy.copy(ours) == ours and copy.deepcopy(ours) == ours and type(copy.deepcopy(ours)) is Ours
    assert Ours.job.__doc__ == Typed.job.__doc__
    assert not hasattr(ours, "__dict__")  # __slots__ = (): no instance dictionary
    for call in (lambda k: k(1, nodes=("b",)), lambda k: k(node="x", job=2), lambda k: k(3, "y")):
        assert (
            type(call(Ours)) is Ours
            and call(Ours) == call(Typed)
            and repr(call(Ours)) == repr(call(Typed)).replace("Typed", "Ours")
        )
    refused = (lambda k: k(), lambda k: k(1, "", (), 4), lambda k: k(1, bad=2), lambda k: k(1, job=2),
               lambda k: k(node="x"), lambda k: k._make([1]))  # fmt: skip
    for call in refused:
        with pytest.raises(TypeError):
            call(Typed)
        with pytest.raises(TypeError):
            call(Ours)
    with pytest.raises(ValueError, match="unexpected field names: \\['bad'\\]"):
        ours._replace(bad=1)


def test_importing_it_loads_no_collections() -> None:
    """In a fresh interpreter (as the hooks run), defining records leaves collections (and operator) unloaded.

    Without site (-S): an editable install's path hook, as the test venv has, imports pathlib (collections).
    """
    repo = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {repo!r}); from imexctl.platform import Record\n"
        "class R(Record):\n    a: int\n    b: str = ''\n"
        "assert R(1)._replace(b='x') == (1, 'x'), R(1)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('collections', 'typing', 'operator', '_operator')))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_field_names_are_checked() -> None:
    (base,) = Record.__mro_entries__(())
    for bad in ("_a", "_fields", "a b", "1a"):
        with pytest.raises(ValueError, match="bad or repeated field name"):
            type(base)("Bad", (base,), {"__module__": __name__, "__annotations__": {bad: "int"}})
