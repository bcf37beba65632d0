"""The floor: errors, the Host seam to the operating system, safe file I/O, /proc scans, log lines; and ``Record``.

``Record`` is the base of imexctl's records, a :class:`typing.NamedTuple` that is cheap to define.  It is
defined here, in the package's own module, because every hook loads this package before anything else of the
floor: a module of its own cost every hook's fast tier about 0.07 ms (docs/performance.md "Hook start-up").

To mypy (and to a reader) ``class Channel(Record)`` is ``class Channel(NamedTuple)``.
At run time the class is what :func:`collections.namedtuple` would make from the
field annotations in the class body, with the defaults, docstring and methods of
the body, as ``typing.NamedTuple`` makes it, but cheaper in two ways:

- without ``typing``'s check of each annotation: under ``from __future__ import
  annotations`` every annotation is a string, which ``typing`` compiles into a
  ``ForwardRef`` and compares with six special forms, for a check no record of
  imexctl's needs.  That was 2 to 3 ms of every hook's start for the 45 or so
  records on its path (docs/performance.md "Own CPU");
- without importing :mod:`collections` (about 2 ms under ``python -I``): the
  hooks' fast tier defines the gates' records (``config.schema``) and loads
  nothing else that needs it.  The class is made here: a ``tuple`` subclass
  with ``__slots__ = ()``, a ``__new__`` that takes its fields by position or
  by name, with the defaults (a closure: nothing compiled per class), a read-only property per field, and
  ``_fields``, ``_field_defaults``, ``_make``, ``_replace``, ``_asdict``,
  ``__repr__``, ``__getnewargs__`` and ``__match_args__`` as namedtuple has
  them (tests/platform/test_record.py compares the two).  The property of a
  position is made once and shared by every record, a plain function rather
  than ``operator.itemgetter``: importing ``_operator`` cost the fast tier as
  much as a module of its own, and a field reads in 40 ns instead of 20.

Only what imexctl's records use is supported: fields with or without defaults
(no field without a default after one with), methods, properties and class
constants.  No generics and no subclassing of a record.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
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

    def _check_names(typename: str, fields: tuple[str, ...]) -> None:
        """Identifiers, none starting with '_' (namedtuple's own names), no repeat; a class body names no keyword."""
        if len(set(fields)) == len(fields) and all(name.isidentifier() and name[0] != "_" for name in fields):
            return
        seen: set[str] = set()
        for name in fields:
            if not name.isidentifier() or name.startswith("_") or name in seen:
                raise ValueError(f"{typename}: bad or repeated field name {name!r}")
            seen.add(name)

    _MISSING = object()

    def _new(typename: str, fields: tuple[str, ...], defaults: tuple[object, ...], shown: str) -> object:
        """``__new__(cls, *values, **by_name)`` for these fields, the defaults filling the last ones.

        A call with every field by position (the common one) goes straight to ``tuple.__new__``; any other is
        bound here, refused as a function with these parameters would refuse it.  A closure, not code
        compiled per class as namedtuple's: defining a record costs half as much (about 45 on the prolog's
        path), and a call by position the same.
        """
        count = len(fields)
        first_default = count - len(defaults)

        def bind(args: tuple[object, ...], named: dict[str, object]) -> list[object]:
            if len(args) > count:
                raise TypeError(f"{typename}() takes at most {count} arguments ({len(args)} given)")
            values = [*args, *([_MISSING] * (count - len(args)))]
            for name, value in named.items():
                if name not in fields:
                    raise TypeError(f"{typename}() got an unexpected keyword argument {name!r}")
                i = fields.index(name)
                if i < len(args):
                    raise TypeError(f"{typename}() got multiple values for argument {name!r}")
                values[i] = value
            for i in range(len(args), count):
                if values[i] is _MISSING:
                    if i < first_default:
                        raise TypeError(f"{typename}() missing required argument {fields[i]!r}")
                    values[i] = defaults[i - first_default]
            return values

        def __new__(cls: type, *args: object, **named: object) -> tuple[object, ...]:  # noqa: N807 # it is __new__
            if named and not args and len(named) == count and all(name in named for name in fields):
                return tuple.__new__(cls, [named[name] for name in fields])  # every field by name: the settings'
            if named or len(args) != count:
                return tuple.__new__(cls, bind(args, named))
            return tuple.__new__(cls, args)

        __new__.__qualname__ = typename + ".__new__"
        __new__.__doc__ = "Create new instance of " + shown
        return __new__

    def _make(cls: type, iterable: object) -> tuple[object, ...]:
        made = tuple.__new__(cls, iterable)
        if len(made) != len(cls._fields):  # type: ignore[attr-defined]
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")  # type: ignore[attr-defined]
        return made

    def _replace(self: tuple[object, ...], /, **changes: object) -> tuple[object, ...]:
        made = self._make(changes.pop(name, value) for name, value in zip(self._fields, self))  # type: ignore[attr-defined]
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return made

    def _repr(self: tuple[object, ...]) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))  # type: ignore[attr-defined]
        return f"{type(self).__name__}({shown})"

    def _asdict(self: tuple[object, ...]) -> dict[str, object]:
        return dict(zip(self._fields, self))  # type: ignore[attr-defined]

    def _getnewargs(self: tuple[object, ...]) -> tuple[object, ...]:
        return tuple(self)

    # the property of each position, with namedtuple's docstring: made once, shared by every record
    _GETTERS: list[property] = []

    def _getters(count: int) -> list[property]:
        """The properties of the first ``count`` positions."""
        while len(_GETTERS) < count:
            n = len(_GETTERS)
            _GETTERS.append(property(lambda self, _n=n: self[_n], doc="Alias for field number " + str(n)))
        return _GETTERS[:count]

    def _record_class(
        typename: str, fields: tuple[str, ...], defaults: list[object], module: str, body: dict[str, object]
    ) -> type:
        """The tuple subclass ``collections.namedtuple(typename, fields, defaults=..., module=...)`` makes.

        ``body``: what the class adds (its methods, constants, annotations).
        """
        _check_names(typename, fields)
        shown = typename + "(" + ", ".join(fields) + ")"
        made: dict[str, object] = {
            "__doc__": shown,
            "__slots__": (),
            "_fields": fields,
            "_field_defaults": dict(zip(fields[len(fields) - len(defaults) :], defaults)),
            "__new__": staticmethod(_new(typename, fields, tuple(defaults), shown)),
            "_make": classmethod(_make),
            "_replace": _replace,
            "__repr__": _repr,
            "_asdict": _asdict,
            "__getnewargs__": _getnewargs,
            "__match_args__": fields,
            "__module__": module,
        }
        made.update(zip(fields, _getters(len(fields))))
        made.update(body)
        return type(typename, (tuple,), made)

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
            body: dict[str, object] = {"__annotations__": dict(annotations)}
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"{typename}: a record cannot define {key}")
                if key not in _SPECIAL and key not in annotations:
                    body[key] = value
            return _record_class(typename, tuple(annotations), defaults, str(ns["__module__"]), body)

    _Base = type.__new__(_RecordMeta, "Record", (), {})

    def Record(*_args: object, **_kwargs: object) -> None:  # noqa: N802 # named as the class it stands for
        """Derive records from it (``class X(Record)``); it is not called."""
        raise TypeError("Record is a base class: derive a record from it")

    Record.__mro_entries__ = lambda _bases: (_Base,)

__all__ = ["Record"]
