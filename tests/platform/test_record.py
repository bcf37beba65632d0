"""Record: what typing.NamedTuple makes, made without its annotation checks."""

from __future__ import annotations

from typing import NamedTuple, get_type_hints

import pytest

from imexctl.platform.record import Record


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
