r"""Read ``slurm.conf`` the way Slurm does, for the few keys imexctl needs (pure but for file reads).

Syntax (SchedMD/slurm ``src/common/parse_config.c``; slurm.conf(5)): keys are
case-insensitive; ``#`` starts a comment unless escaped as ``\\#``; a line
ending in an odd number of backslashes continues on the next; a line
``Include <file>`` reads that file in place (relative paths against the
including file's directory, glob patterns allowed); a line holds one or more
``Key=Value`` pairs, values may be double-quoted; the last value of a key wins,
except keys Slurm allows on several lines (``Prolog``, ``Epilog`` since 24.05).
Lines that describe records (``NodeName=``, ``PartitionName=``...) are kept
apart so their keys do not shadow global ones.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Final

from imexctl.platform import Record
from imexctl.platform.errors import ConfigError
from imexctl.platform.fsutil import read_text_nofollow

__all__ = [
    "RECORD_KEYS",
    "SlurmConf",
    "batch_waits_for_prologs",
    "hook_timeout",
    "parse_text",
    "prolog_flags",
    "read",
]

#: first keys of lines that describe one record, not global settings
RECORD_KEYS: Final = frozenset(
    {"nodename", "partitionname", "nodeset", "frontendname", "downnodes", "switchname", "blockname"}
)
_PAIR: Final = re.compile(r'([A-Za-z][A-Za-z0-9_]*)\s*[-+*/]?=\s*(?:"([^"]*)"|(\S*))')
_MAX_DEPTH: Final = 8


class SlurmConf(Record):
    """The settings of one slurm.conf and the files it includes."""

    path: Path
    #: lower-case key -> every value, in file order
    values: dict[str, tuple[str, ...]]
    #: (first key lower-case, {key: value}) of record lines, e.g. NodeName lines
    records: tuple[tuple[str, dict[str, str]], ...]
    #: slurm.conf and every file it included, in reading order
    files: tuple[Path, ...]

    def get(self, key: str) -> str | None:
        """The value in effect for ``key`` (the last one), or None."""
        found = self.values.get(key.lower())
        return found[-1] if found else None

    def get_all(self, key: str) -> tuple[str, ...]:
        """Every value of ``key`` in file order (for keys allowed on several lines)."""
        return self.values.get(key.lower(), ())

    def seconds(self, key: str) -> int | None:
        """An integer number of seconds, or None when unset; ConfigError when not a number."""
        text = self.get(key)
        if text is None or text == "":
            return None
        if not text.isdigit():
            raise ConfigError(f"{self.path}: {key}={text!r} is not a number of seconds")
        return int(text)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """``(first line number, line)`` with comments stripped and continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(?<!\\)((?:\\\\)*)#.*", r"\1", raw)
        stripped = line.rstrip()
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if not pending:
            start = number
        if trailing % 2 == 1:
            pending += stripped[:-1]
            continue
        out.append((start, (pending + line).replace("\\#", "#").replace("\\\\", "\\")))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def parse_text(text: str, source: str) -> tuple[list[tuple[str, str]], list[tuple[str, dict[str, str]]], list[str]]:
    """Split one file into global ``(key, value)`` pairs, record lines and include targets."""
    pairs: list[tuple[str, str]] = []
    records: list[tuple[str, dict[str, str]]] = []
    includes: list[str] = []
    for number, line in _logical_lines(text):
        words = line.split(None, 1)
        if not words:
            continue
        if words[0].lower() == "include":
            if len(words) < 2:
                raise ConfigError(f"{source}:{number}: Include without a file name")
            includes.append(words[1].strip())
            continue
        found = [(m.group(1), m.group(2) if m.group(2) is not None else m.group(3)) for m in _PAIR.finditer(line)]
        if not found:
            raise ConfigError(f"{source}:{number}: not a Key=Value line: {line.strip()!r}")
        if found[0][0].lower() in RECORD_KEYS:
            records.append((found[0][0].lower(), dict(found)))
        else:
            pairs += found
    return pairs, records, includes


def read(path: Path, *, root: Path | None = None) -> SlurmConf:
    """Read slurm.conf and what it includes.

    ``root`` (``imexctl doctor``, ``[paths] root``): absolute ``Include`` paths
    are taken under it, so a test tree can hold a whole ``/etc/slurm``.

    Raises:
        ConfigError: a file cannot be read, an include is missing or nested too deep, a line is malformed.
    """
    values: dict[str, list[str]] = {}
    records: list[tuple[str, dict[str, str]]] = []
    files: list[Path] = []
    _read_into(path, values, records, files, depth=0, root=root)
    return SlurmConf(path, {k: tuple(v) for k, v in values.items()}, tuple(records), tuple(files))


def _read_into(
    path: Path,
    values: dict[str, list[str]],
    records: list[tuple[str, dict[str, str]]],
    files: list[Path],
    depth: int,
    root: Path | None = None,
) -> None:
    if depth > _MAX_DEPTH:
        raise ConfigError(f"{path}: Include nested more than {_MAX_DEPTH} deep")
    try:
        text = read_text_nofollow(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    files.append(path)
    pairs, recs, includes = parse_text(text, str(path))
    for key, value in pairs:
        values.setdefault(key.lower(), []).append(value)
    records += recs
    for target in includes:
        if target.startswith("/"):
            pattern = str(root / target.lstrip("/")) if root is not None else target
        else:
            pattern = str(path.parent / target)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise ConfigError(f"{path}: Include {target}: no such file")
        for match in matches:
            _read_into(Path(match), values, records, files, depth + 1, root)


def hook_timeout(conf: SlurmConf, hook: str) -> tuple[int, str] | None:
    """The time slurmd gives a ``prolog`` or ``epilog`` script, and the key that sets it.

    ``PrologTimeout``/``EpilogTimeout`` (Slurm 25.05+) override
    ``PrologEpilogTimeout``; unset or 0 means slurmd waits indefinitely (None).
    """
    for key in (f"{hook.capitalize()}Timeout", "PrologEpilogTimeout"):
        seconds = conf.seconds(key)
        if seconds is not None:
            return (seconds, key) if seconds > 0 else None
    return None


def prolog_flags(conf: SlurmConf) -> frozenset[str]:
    """``PrologFlags``, lower-case, one word per flag (Slurm reads them without regard to case)."""
    return frozenset(f.strip().lower() for f in (conf.get("PrologFlags") or "").split(",") if f.strip())


def batch_waits_for_prologs(flags: frozenset[str]) -> bool:
    """Whether slurmctld holds a job's batch script until every tray's prolog has reported.

    ``DeferBatch``: slurmctld keeps the batch launch back while the job's
    ``state_reason`` is ``WAIT_PROLOG`` (``_batch_launch_defer``,
    src/slurmctld/agent.c), which it sets only with ``Alloc`` and without
    ``NoHold`` (node_scheduler.c), and clears when the last tray's prolog
    reports, failed or not (``prolog_complete``, job_mgr.c); a job no longer
    running by then (requeued, cancelled) is not launched at all.  The same in
    22.05, 24.11 and 26.05 (design.md source slurm-deferbatch).  ``DeferBatch``
    implies ``Alloc`` from 26.05; before, without ``Alloc`` (or a flag that
    implies it) no prolog runs at allocation at all, which ``imexctl doctor``
    fails.
    """
    return "deferbatch" in flags and "nohold" not in flags
