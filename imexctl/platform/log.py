"""The log lines: their sink, the hooks' :class:`LineLogger`, and :func:`render_json`, the one renderer of each line.

Every line carries ``hook``, ``job_id`` and ``node`` once they are bound
(:meth:`LineLogger.bind_context` in a hook, structlog's context in an admin's
command: :mod:`imexctl.platform.logsetup` sets it up, and holds the event
catalogue).  The prolog and the epilog, which delay every job on every tray,
write their lines through :class:`LineLogger` and import structlog only to log
a crash with its trace (docs/performance.md "Hook start-up").  Light enough for
the hooks' fast tier: at module level it imports only ``os``, ``sys`` and
``time``.
"""

from __future__ import annotations

import os
import sys
import time

# typing and pathlib are not imported at run time (start-up cost of the hooks' fast path); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO, Any

__all__ = [
    "LEVELS",
    "LineLogger",
    "SinkLogger",
    "dir_problem",
    "open_log_file",
    "open_sink",
    "render_json",
    "utc_timestamp",
]


#: the level names, and the numbers structlog and syslog order them by
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class SinkLogger:
    """The one structlog logger: writes each rendered line to the log file, stderr and syslog.

    structlog calls the method named after the level (``info``, ``error``,
    ``exception``...) with the line the last processor (the JSON renderer)
    made; the level decides whether stderr and syslog get it too.
    """

    def __init__(self, file: IO[str] | None, stderr: IO[str] | None, stderr_level: int, syslog: bool) -> None:
        self._file, self._stderr, self._stderr_level, self._syslog = file, stderr, stderr_level, syslog
        #: stderr gets no line (an admin's command says its failure there in plain words: cli.main)
        self.quiet = False
        if syslog:
            import syslog as _syslog

            _syslog.openlog("imexctl", _syslog.LOG_PID, _syslog.LOG_DAEMON)

    def write(self, line: str, level: int) -> None:
        """Send one rendered line to every sink that takes its level."""
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if self._stderr is not None and level >= self._stderr_level and not self.quiet:
            self._stderr.write(line + "\n")
            self._stderr.flush()
        if self._syslog:
            import syslog

            syslog.syslog(
                syslog.LOG_ERR if level >= 40 else syslog.LOG_WARNING if level >= 30 else syslog.LOG_INFO, line
            )

    def debug(self, line: str) -> None:
        """A debug line."""
        self.write(line, 10)

    def info(self, line: str) -> None:
        """An info line."""
        self.write(line, 20)

    msg = info

    def warning(self, line: str) -> None:
        """A warning line."""
        self.write(line, 30)

    def error(self, line: str) -> None:
        """An error line."""
        self.write(line, 40)

    exception = error

    def critical(self, line: str) -> None:
        """A critical line."""
        self.write(line, 50)


def open_sink(
    *, log_file: str | Path | None = None, stderr_level: str = "warning", syslog: bool = False, make_dir: bool = True
) -> tuple[SinkLogger, str | None]:
    """The one sink of this run, and a warning text if the log file could not be opened (then stderr only)."""
    problem = None
    file = None
    if log_file:
        try:
            file = open_log_file(log_file, make_dir=make_dir)
        except OSError as exc:
            problem = f"cannot open log file {log_file}: {exc.strerror}"
    return SinkLogger(file, sys.stderr, LEVELS[stderr_level], syslog), problem


class LineLogger:
    """The lines of :func:`configure_structlog`, rendered without importing structlog.

    ``import structlog`` costs about 60 ms (``structlog.stdlib`` pulls in
    ``asyncio`` and ``ssl``; docs/performance.md), three times what the
    interpreter needs to start.  A prolog that policy skips and an epilog
    with nothing to do write only their summary lines, on every tray for
    every job: they use this logger instead.  It renders what structlog's
    processors render, field for field: the call's fields, ``event``, the
    bound context (``hook``, ``job_id``, ``node``), ``level``, ``timestamp``
    (tests/platform/test_log.py compares the two).  It knows ``debug``, ``info``,
    ``warning`` and ``error``; exceptions are left to structlog.
    """

    def __init__(self, sink: SinkLogger, level: str, context: dict[str, Any]) -> None:
        self.sink, self.level, self.context = sink, level, dict(context)
        self._level = LEVELS[level]

    def bind_context(self, **kw: Any) -> None:
        """Add fields to every later line (what ``structlog.contextvars.bind_contextvars`` does)."""
        self.context.update(kw)

    def debug(self, event: str, **kw: Any) -> None:
        """A debug line."""
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        """An info line."""
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        """A warning line."""
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        """An error line."""
        self._emit("error", event, kw)

    def _emit(self, method: str, event: str, kw: dict[str, Any]) -> None:
        if LEVELS[method] < self._level:
            return
        line = {**kw, "event": event}
        for key, value in self.context.items():  # merge_contextvars: the call's own fields win
            line.setdefault(key, value)
        line["level"] = method
        line["timestamp"] = utc_timestamp(time.time_ns())
        getattr(self.sink, method)(render_json(line))


def utc_timestamp(ns: int) -> str:
    """``ns`` (``time.time_ns()``) as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it, without datetime.

    That is ``datetime.now(timezone.utc).isoformat()`` with ``Z`` for ``+00:00``:
    microseconds, left out when they are 0 (``2026-12-04T19:30:23.000120Z``,
    ``2026-12-04T19:30:23Z``).  ``datetime`` costs about 1 ms to import.
    """
    seconds, rest = divmod(ns, 1_000_000_000)
    micro = rest // 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + (f".{micro:06d}Z" if micro else "Z")


def render_json(value: Any) -> str:
    """``json.dumps(value)`` as structlog's JSONRenderer calls it, without importing ``json`` for plain lines.

    ``import json`` costs a hook's fast path about 10 ms (it imports ``re``).
    Lines of ASCII strings, ints, finite floats, booleans, None, lists,
    tuples and dicts with string keys are rendered here, byte for byte as
    ``json.dumps`` renders them (tests/platform/test_log.py); anything else goes to
    ``json.dumps``.
    """
    try:
        return _render(value)
    except _NotPlain:
        import json

        return json.dumps(value, default=_json_fallback)


class _NotPlain(Exception):
    """A value that :func:`render_json` leaves to ``json.dumps``."""


# json.dumps's ensure_ascii escapes: the short forms, then \u00XX for every other control character and DEL
_ESCAPES = {
    **{i: f"\\u{i:04x}" for i in (*range(0x20), 0x7F)},
    **{ord(c): e for c, e in zip('"\\\n\r\t\b\f', ('\\"', "\\\\", "\\n", "\\r", "\\t", "\\b", "\\f"))},
}


_INF = float("inf")


def _render(value: Any) -> str:
    kind = type(value)
    if kind is str:
        text: str = value
        if not text.isascii():
            raise _NotPlain
        if text.isprintable() and '"' not in text and "\\" not in text:  # most fields: nothing to escape
            return '"' + text + '"'
        return '"' + text.translate(_ESCAPES) + '"'
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if not -_INF < value < _INF:  # also NaN: json.dumps writes NaN, Infinity, -Infinity
            raise _NotPlain
        return float.__repr__(value)
    if kind is list or kind is tuple:
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise _NotPlain
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in value.items()) + "}"
    raise _NotPlain


def _json_fallback(obj: Any) -> Any:
    """What structlog's JSONRenderer writes for a value json cannot: ``__structlog__()``, else ``repr``."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


def dir_problem(directory: str | Path) -> str:
    """Why the hooks must not write into ``directory`` (their log's, the metrics'), or '' when they may.

    The config directory's rule (``schema``: symlinks followed, the real
    directory judged), except for its group: a directory that others may
    write is refused, as is one owned by anybody but root (or this process's
    user), but the group may write it.  Stock Ubuntu makes ``/var/log``
    ``root:syslog 0775`` (rsyslog's postinst runs ``chgrp syslog /var/log;
    chmod g+w /var/log``), and the log would otherwise be lost on every such
    tray.  Whoever may write the directory can plant a file or a FIFO at the
    log's name, or swap the metrics under node_exporter (issue 33).
    """
    try:
        st = os.stat(directory)
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    import stat

    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & stat.S_IWOTH:
        return (
            f"{directory} must be owned by root and not writable by others "
            f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
        )
    return ""


def open_log_file(path: str | Path, *, make_dir: bool = True) -> IO[str]:
    """Open the log file for appending (mode 0640); ``make_dir``: create its directory.

    Only a regular file of root's (or this process's user's) that others may
    not write, in a directory :func:`dir_problem` accepts; never through a
    symlink, and never waiting (``O_NONBLOCK``: a FIFO planted at the log's
    name blocked every hook until slurmd killed it and drained the tray,
    issue 33).  Appending never reads the file, whatever its size.

    Raises:
        OSError: the directory or the file is refused, or cannot be opened (``filename`` is the path).
    """
    # errno only where it fails: importing it cost every hook 0.07 ms (docs/performance.md)
    directory = os.path.dirname(os.fspath(path)) or "."
    if make_dir:
        from pathlib import Path

        from imexctl.platform.fsutil import ensure_dir

        ensure_dir(Path(directory))
    problem = dir_problem(directory)
    if problem:
        import errno

        raise OSError(errno.EPERM, problem, os.fspath(path))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o640)
    except OSError as exc:
        import errno

        why = {errno.ELOOP: "is a symbolic link (not followed)", errno.ENXIO: "is a FIFO (not a regular file)"}
        raise OSError(exc.errno, why.get(exc.errno or 0, exc.strerror or str(exc)), os.fspath(path)) from None
    import stat

    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & stat.S_IWOTH:
        import errno

        os.close(fd)
        what = "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"
        raise OSError(
            errno.EPERM,
            f"must be a regular file of root's that others may not write, not {what} "
            f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
            os.fspath(path),
        )
    return os.fdopen(fd, "a", encoding="utf-8")
