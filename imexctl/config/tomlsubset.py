"""Read the few keys ``imexctl doctor`` needs from a TOML file, also on Python < 3.11.

``tomllib`` (Python 3.11+) is used when present.  Python 3.9 and 3.10 (RHEL 9's
``/usr/bin/python3`` is 3.9) get a reader of the subset that
``nvidia-ctk config`` writes: ``[table]`` headers, ``key = value`` lines with
bare or dotted keys, booleans, strings, integers, and arrays or inline tables
(skipped, also over several lines).  Anything else makes the result
*uncertain*: the reader says so instead of guessing, and the checks report
"cannot verify" rather than OK.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Document", "TomlError", "load"]

_INT = re.compile(r"[+-]?[0-9](?:_?[0-9])*")
_BARE = re.compile(r"[A-Za-z0-9_-]+")


class TomlError(ValueError):
    """The text is not TOML (or not TOML this reader can follow)."""


class Document:
    """Tables by dotted name, each a dict of its keys; ``uncertain`` says what the subset reader skipped."""

    def __init__(self, tables: dict[str, dict[str, Any]], uncertain: str = "") -> None:
        self.tables = tables
        self.uncertain = uncertain

    def get(self, table: str, key: str, default: Any = None) -> Any:
        """The value of ``key`` in ``table`` ('' for the top level), or ``default``."""
        return self.tables.get(table, {}).get(key, default)


def load(text: str, *, use_tomllib: bool = True) -> Document:
    """Parse ``text``.

    Raises:
        TomlError: invalid TOML (with tomllib), or a line the subset reader cannot read.
    """
    if use_tomllib:
        try:
            import tomllib
        except ImportError:
            pass
        else:
            try:
                return _flatten(tomllib.loads(text))
            except tomllib.TOMLDecodeError as exc:
                raise TomlError(str(exc)) from None
    return _Subset(text).read()


def _flatten(data: dict[str, Any], prefix: str = "") -> Document:
    tables: dict[str, dict[str, Any]] = {prefix: {}}
    for key, value in data.items():
        if isinstance(value, dict):
            tables.update(_flatten(value, f"{prefix}.{key}" if prefix else key).tables)
        else:
            tables[prefix][key] = value
    return Document(tables)


class _Opaque:
    """A value the subset reader skipped (an array, an inline table, a float, a date)."""

    def __repr__(self) -> str:
        return "<skipped>"


class _Subset:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.i = 0
        self.tables: dict[str, dict[str, Any]] = {"": {}}
        self.table: str | None = ""
        self.declared: set[str] = set()
        self.uncertain: list[str] = []

    def read(self) -> Document:
        while self.i < len(self.lines):
            raw = self.lines[self.i]
            self.i += 1
            line = _strip_comment(raw).strip()
            if not line:
                continue
            if line.startswith("["):
                self._header(line, raw)
            else:
                self._key_value(line, raw)
        return Document(self.tables, "; ".join(self.uncertain))

    def _header(self, line: str, raw: str) -> None:
        if line.startswith("[["):  # an array of tables: its keys are nothing we read
            self.table = None
            if not line.endswith("]]"):
                raise TomlError(f"cannot read {raw!r}")
            return
        if not line.endswith("]"):
            raise TomlError(f"cannot read {raw!r}")
        self.table = ".".join(_key_parts(line[1:-1], raw))
        if self.table in self.declared:
            raise TomlError(f"table [{self.table}] declared twice")
        self.declared.add(self.table)
        self.tables.setdefault(self.table, {})

    def _key_value(self, line: str, raw: str) -> None:
        key, sep, value = line.partition("=")
        if not sep:
            raise TomlError(f"cannot read {raw!r}")
        parts = _key_parts(key, raw)
        if self.table is None:
            return
        table = ".".join(p for p in (self.table, *parts[:-1]) if p)
        target = self.tables.setdefault(table, {})
        if parts[-1] in target:
            raise TomlError(f"key {'.'.join(parts)} set twice in [{self.table}]")
        target[parts[-1]] = self._value(value.strip(), raw)

    def _value(self, text: str, raw: str) -> Any:
        if text in ("true", "false"):
            return text == "true"
        if text.startswith(('"""', "'''")):
            self._skip_until(text[:3], text[3:])
            return _Opaque()
        if len(text) >= 2 and text[0] == text[-1] == "'" and "'" not in text[1:-1]:
            return text[1:-1]
        if len(text) >= 2 and text[0] == text[-1] == '"' and '"' not in text[1:-1].replace('\\"', ""):
            return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if _INT.fullmatch(text):
            return int(text.replace("_", ""))
        if text.startswith(("[", "{")):
            self._skip_brackets(text)
            if text.startswith("{"):
                self.uncertain.append(f"inline table in {raw.strip()!r}")
            return _Opaque()
        if not text:
            raise TomlError(f"no value in {raw!r}")
        return _Opaque()

    def _skip_brackets(self, text: str) -> None:
        depth = _depth(text)
        while depth > 0:
            if self.i >= len(self.lines):
                raise TomlError("unclosed array or inline table")
            depth += _depth(_strip_comment(self.lines[self.i]))
            self.i += 1

    def _skip_until(self, quote: str, rest: str) -> None:
        while quote not in rest:
            if self.i >= len(self.lines):
                raise TomlError("unclosed multi-line string")
            rest = self.lines[self.i]
            self.i += 1


def _key_parts(key: str, raw: str) -> list[str]:
    parts = []
    for piece in key.split("."):
        part = piece.strip()
        if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'":
            parts.append(part[1:-1])
        elif _BARE.fullmatch(part):
            parts.append(part)
        else:
            raise TomlError(f"cannot read the key in {raw!r}")
    return parts


def _strip_comment(line: str) -> str:
    quote = ""
    escaped = False
    for i, c in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\" and quote == '"':
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "#":
            return line[:i]
    return line


def _depth(text: str) -> int:
    depth, quote, escaped = 0, "", False
    for c in text:
        if quote:
            if escaped:
                escaped = False
            elif c == "\\" and quote == '"':
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
    return depth
