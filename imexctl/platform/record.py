"""``Record``: the base of imexctl's records, a :class:`typing.NamedTuple` that is cheap to define.

To mypy (and to a reader) ``class Channel(Record)`` is ``class Channel(NamedTuple)``.
At run time the class is made by :func:`collections.namedtuple` from the field
annotations in the class body, with the defaults, docstring and methods of the
body, as ``typing.NamedTuple`` makes it, but without its check of each
annotation: under ``from __future__ import annotations`` every annotation is a
string, which ``typing`` compiles into a ``ForwardRef`` and compares with six
special forms, for a check no record of imexctl's needs.  That was 2 to 3 ms
of every hook's start for the 45 or so records on its path
(docs/performance.md "Own CPU").

Only what imexctl's records use is supported: fields with or without defaults
(no field without a default after one with), methods, properties and class
constants.  No generics and no subclassing of a record.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    import collections

    # as typing.NamedTuple: what a record's body may not define, and what it does not copy onto the class
    _PROHIBITED = frozenset(
        [
            "__new__",
            "__init__",
            "__slots__",
            "__getnewargs__",
            "_fields",
            "_field_defaults",
            "_make",
            "_replace",
            "_asdict",
        ]
    )
    _SPECIAL = frozenset(("__module__", "__name__", "__annotations__"))

    class _RecordMeta(type):
        def __new__(mcls, typename: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
            if bases != (_Base,):
                raise TypeError(f"{typename}: a record derives from Record alone")
            annotations = ns.get("__annotations__", {})
            defaults = []
            for name in annotations:
                if name in ns:
                    defaults.append(ns[name])
                elif defaults:
                    raise TypeError(f"{typename}: field {name} without a default follows one with a default")
            cls = collections.namedtuple(  # noqa: PYI024 # what typing.NamedTuple calls, less its checks
                typename, tuple(annotations), defaults=defaults, module=ns["__module__"]
            )
            cls.__annotations__ = dict(annotations)
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"{typename}: a record cannot define {key}")
                if key not in _SPECIAL and key not in annotations:
                    setattr(cls, key, value)
            return cls

    _Base = type.__new__(_RecordMeta, "Record", (), {})

    def Record(*_args: object, **_kwargs: object) -> None:  # noqa: N802 # named as the class it stands for
        """Derive records from it (``class X(Record)``); it is not called."""
        raise TypeError("Record is a base class: derive a record from it")

    Record.__mro_entries__ = lambda _bases: (_Base,)

__all__ = ["Record"]
